package extproc

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestREADMEGRPCStatusTable holds README's table of gRPC answers to the
// codes the server sends: every row's status is the one grpcCodes gives its
// slug, and every slug in grpcCodes has a row. The calls through grpc-go
// (internal/grpcxds) and Envoy (internal/e2e) show the codes reaching a
// client for most rows; this is the one check on the rows no end-to-end
// test provokes (outcome unknown, body too large, no principal).
func TestREADMEGRPCStatusTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| [^|]+ \\| `([A-Z_]+)` \\| (.+) \\|$")
	slug := regexp.MustCompile("`([a-z-]+):")
	_, table, found := strings.Cut(string(readme), "| situation | gRPC status | message starts with |")
	if !found {
		t.Fatal("README has no table of gRPC answers")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	seen := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil || m[1] == "ALREADY_EXISTS" {
			continue
		}
		// codes.Code reads the canonical names (FAILED_PRECONDITION) from JSON.
		var code codes.Code
		if err := code.UnmarshalJSON([]byte(`"` + m[1] + `"`)); err != nil {
			t.Errorf("README names an unknown gRPC code %s", m[1])
			continue
		}
		for _, s := range slug.FindAllStringSubmatch(m[2], -1) {
			seen[s[1]] = true
			if got, ok := grpcCodes[s[1]]; !ok || got != code {
				t.Errorf("README: %s answers %s; the server sends %v", s[1], m[1], got)
			}
		}
	}
	for s := range grpcCodes {
		if !seen[s] {
			t.Errorf("README's gRPC table has no row for %s", s)
		}
	}
	if len(seen) < 8 {
		t.Fatalf("found %d slugs in README's gRPC table; is the table still there?", len(seen))
	}
}

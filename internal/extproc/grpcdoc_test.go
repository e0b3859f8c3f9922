package extproc

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestDocumentedGRPCStatusTable holds docs/grpc.md's table of gRPC answers
// to the codes the server sends: every row's status is the one grpcCodes
// gives its slug, and every slug in grpcCodes has a row. The calls through
// grpc-go (test/grpcxds) and Envoy (test/e2e) show the codes
// reaching a client for most rows; this is the one check on the rows no
// end-to-end test provokes (outcome unknown, body too large, no principal).
func TestDocumentedGRPCStatusTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/grpc.md")
	if err != nil {
		t.Fatal(err)
	}
	cells := func(line string) []string {
		parts := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		return parts
	}
	codeCell := regexp.MustCompile("^`([A-Z_]+)`$")
	slug := regexp.MustCompile("`([a-z-]+):")
	var table []string
	for _, line := range strings.Split(string(doc), "\n") {
		isRow := strings.HasPrefix(line, "|")
		if table == nil && isRow && slices.Contains(cells(line), "gRPC status") && slices.Contains(cells(line), "message starts with") {
			table = []string{line}
		} else if table != nil && isRow {
			table = append(table, line)
		} else if table != nil {
			break
		}
	}
	if len(table) < 3 {
		t.Fatal("docs/grpc.md has no table of gRPC answers")
	}
	header := cells(table[0])
	codeCol, msgCol := slices.Index(header, "gRPC status"), slices.Index(header, "message starts with")
	seen := map[string]bool{}
	for _, line := range table[2:] { // past the header and its delimiter row
		row := cells(line)
		if len(row) != len(header) {
			t.Errorf("docs/grpc.md row %q: %d cells, want %d", line, len(row), len(header))
			continue
		}
		m := codeCell.FindStringSubmatch(row[codeCol])
		if m == nil {
			t.Errorf("docs/grpc.md row %q: no gRPC code in its status cell", line)
			continue
		}
		if m[1] == "ALREADY_EXISTS" {
			continue // the replay: no problem slug
		}
		// codes.Code reads the canonical names (FAILED_PRECONDITION) from JSON.
		var code codes.Code
		if err := code.UnmarshalJSON([]byte(`"` + m[1] + `"`)); err != nil {
			t.Errorf("docs/grpc.md names an unknown gRPC code %s", m[1])
			continue
		}
		for _, s := range slug.FindAllStringSubmatch(row[msgCol], -1) {
			seen[s[1]] = true
			if got, ok := grpcCodes[s[1]]; !ok || got != code {
				t.Errorf("docs/grpc.md: %s answers %s; the server sends %v", s[1], m[1], got)
			}
		}
	}
	for s := range grpcCodes {
		if !seen[s] {
			t.Errorf("docs/grpc.md's gRPC table has no row for %s", s)
		}
	}
	if len(seen) < 8 {
		t.Fatalf("found %d slugs in docs/grpc.md's gRPC table; is the table still there?", len(seen))
	}
}

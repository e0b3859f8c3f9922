package jsonrpc

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestDocumentedCodes holds the code table of docs/mcp.md ("JSON-RPC
// answers") to the codes the server sends: every row's code is the one
// Code gives its problem type, and every problem type with a code has a
// row, so that an agent's author reads the codes the server sends.
func TestDocumentedCodes(t *testing.T) {
	doc, err := os.ReadFile("../../docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## JSON-RPC answers\n")
	if !ok {
		t.Fatal(`docs/mcp.md has no section "JSON-RPC answers"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	seen := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) < 2 {
			continue
		}
		code, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		if err != nil {
			continue // the header, the delimiter row, other tables' rows
		}
		slug := strings.Trim(strings.TrimSpace(cells[1]), "`")
		seen[slug] = true
		if want, ok := codes[slug]; !ok || want != code {
			t.Errorf("docs/mcp.md gives %s the code %d; the server sends %d (known: %v)", slug, code, want, ok)
		}
	}
	for slug := range codes {
		if !seen[slug] {
			t.Errorf("docs/mcp.md's code table has no row for %s", slug)
		}
	}
	if len(seen) < len(codes) {
		t.Fatalf("found %d rows in docs/mcp.md's code table, want %d", len(seen), len(codes))
	}
}

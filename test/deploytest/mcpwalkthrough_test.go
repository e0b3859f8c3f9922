package deploytest

import (
	"path/filepath"
	"strings"
	"testing"
)

// mcpWalkthroughDoc walks an operator from a plain MCP server to a
// protected one with the shipped files.
const mcpWalkthroughDoc = "docs/mcp-walkthrough.md"

// mcpWalkthroughFiles are the files whose parts the walkthrough shows.
var mcpWalkthroughFiles = []string{"envoy/envoy-mcp.yaml", "examples/mcp-policies.yaml"}

// TestMCPWalkthroughShowsTheShippedFiles: every YAML block of the MCP
// walkthrough is a run of consecutive lines of one of the shipped files it
// walks through (indented as a whole by any amount), so that what a reader
// sees there is what the files, held to the deploy checks here and run by
// the end-to-end tests, say.
func TestMCPWalkthroughShowsTheShippedFiles(t *testing.T) {
	files := map[string][]string{}
	for _, f := range mcpWalkthroughFiles {
		files[f] = strings.Split(string(readFile(t, filepath.Join(repoRoot, f))), "\n")
	}
	n := 0
	for _, b := range codeBlocks(string(readFile(t, filepath.Join(repoRoot, mcpWalkthroughDoc)))) {
		if b.lang != "yaml" {
			continue
		}
		n++
		block := strings.Split(strings.TrimRight(b.text, "\n"), "\n")
		found := ""
		for _, f := range mcpWalkthroughFiles {
			if containsRun(files[f], block) {
				found = f
				break
			}
		}
		if found == "" {
			t.Errorf("%s shows a YAML block that is in none of %v:\n%s", mcpWalkthroughDoc, mcpWalkthroughFiles, b.text)
		}
	}
	if n < 5 {
		t.Fatalf("found %d YAML blocks in %s; is the walkthrough still there?", n, mcpWalkthroughDoc)
	}
}

// containsRun reports whether block is a run of consecutive lines of file,
// each line of the run longer by the same indentation (blank lines blank).
func containsRun(file, block []string) bool {
	for i := 0; i+len(block) <= len(file); i++ {
		indent, ok := strings.CutSuffix(file[i], block[0])
		if !ok || strings.TrimLeft(indent, " ") != "" {
			continue
		}
		match := true
		for j, l := range block {
			want := indent + l
			if l == "" {
				want = ""
			}
			if file[i+j] != want {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docMistakes makes each error message the documentation quotes: the flags
// or the policy file (written as policies.yaml) that produce it.
var docMistakes = map[string]struct {
	args   []string
	policy string
}{
	"policies.yaml:14: policies[1].lease: 2h must be shorter than retention 1h": {policy: `# line 1
defaults:
  retention: 1h
policies:
  - name: orders
    match: {methods: [POST], path: {prefix: /orders}}
  - name: payments
    match:
      methods: [POST]
      path:
        prefix: /payments
    key:
      required: true
    lease: 2h
`},
	"policies.yaml:5: policies[0].match.path.pathprefix: unknown field; did you mean prefix?": {policy: threeMistakes},
	"policies.yaml: the file is empty":                                    {policy: "\n"},
	"policies.yaml:4: policies[0].key: no value":                          {policy: "policies:\n  - name: orders\n    match: {methods: [POST]}\n    key:\n"},
	"--max-message-size: 65536 is below 1 MiB, the smallest Envoy buffer": {args: []string{"--max-message-size", "65536"}},
	"policies.yaml:4: policies[0].scope.header: mcp-session-id must not scope keys: an MCP agent that reconnects gets a new session and must still be recognised": {
		policy: "policies:\n  - name: mcp-tools\n    match: {methods: [POST], path: {exact: /mcp}}\n    scope: {from: header, header: mcp-session-id}\n"},
}

// errorPages are the pages that quote the binary's error messages: the
// README, the reference pages of the flags and the policy file, and the MCP
// walkthrough's common mistakes.
var errorPages = []string{"README.md", "docs/flags.md", "docs/configuration.md", "docs/mcp-walkthrough.md"}

// docExample finds the error messages a page quotes: code spans that start
// with a policy file's name and line, or with a flag and a colon.
var docExample = regexp.MustCompile("`((?:policies\\.yaml(?::[0-9]+)?|--[a-z-]+): [^`]+)`")

// TestDocumentedErrorExamplesAreTheBinarys runs the binary on each mistake
// whose message the documentation quotes and finds the quote, verbatim, in
// what it prints as it exits 2: the pages cannot drift from the messages.
func TestDocumentedErrorExamplesAreTheBinarys(t *testing.T) {
	found := map[string]string{} // quote → the page quoting it
	for _, page := range errorPages {
		doc, err := os.ReadFile(filepath.Join("../..", page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docExample.FindAllStringSubmatch(string(doc), -1) {
			found[m[1]] = page
			if _, ok := docMistakes[m[1]]; !ok {
				t.Errorf("%s quotes %q, which no case here produces: add one", page, m[1])
			}
		}
	}
	for quote, mistake := range docMistakes {
		t.Run(quote, func(t *testing.T) {
			if found[quote] == "" {
				t.Fatalf("no page of %v quotes %q any more: drop the case", errorPages, quote)
			}
			dir := t.TempDir()
			args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, mistake.args...)
			if mistake.policy != "" {
				path := filepath.Join(dir, "policies.yaml")
				if err := os.WriteFile(path, []byte(mistake.policy), 0o600); err != nil {
					t.Fatal(err)
				}
				// Run where the file is, naming it as the pages do.
				args = append(args, "--config", "policies.yaml")
			}
			cmd := exec.Command(binary(t), args...)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), quote) {
				t.Fatalf("the binary says\n%s\nnot %s's %q", out, found[quote], quote)
			}
		})
	}
}

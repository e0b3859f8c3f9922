package codecheck

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idem-extproc/idem-extproc/internal/config"
)

// TestDocYAMLSnippets holds every YAML block of the documentation to what a
// reader pasting it gets: it parses (every document in it), and the policy
// fragments that cmd/idem-extproc's config check test does not load (it
// takes blocks whose top level is a policy file's keys only) load too: a
// file with a homes map, and a list of policies shown without its
// policies key.
func TestDocYAMLSnippets(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	blocks := 0
	for _, f := range files {
		doc, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, block := range yamlBlocks(string(doc)) {
			blocks++
			if strings.Contains(block, "…") {
				continue // an outline with elisions, not a snippet to paste
			}
			name := filepath.Base(f) + " yaml block " + strconv.Itoa(i+1)
			dec := yaml.NewDecoder(strings.NewReader(block))
			var top any
			for n := 0; ; n++ {
				var v any
				if err := dec.Decode(&v); err != nil {
					if err != io.EOF {
						t.Errorf("%s does not parse: %v\n%s", name, err, block)
					}
					break
				}
				if n == 0 {
					top = v
				}
			}
			if policyFile(top) {
				if _, err := config.Parse(name, []byte(block)); err != nil {
					t.Errorf("%s is a policy file that does not load: %v", name, err)
				}
			}
			if policyList(top) {
				indented := "  " + strings.ReplaceAll(strings.TrimRight(block, "\n"), "\n", "\n  ") + "\n"
				if _, err := config.Parse(name, []byte("policies:\n"+indented)); err != nil {
					t.Errorf("%s is a list of policies that does not load: %v", name, err)
				}
			}
		}
	}
	if blocks < 10 {
		t.Fatalf("found %d YAML blocks in the docs; the fence syntax changed?", blocks)
	}
}

// policyFile reports whether v is the top level of a policy file with a
// homes map.
func policyFile(v any) bool {
	m, ok := v.(map[string]any)
	_, h := m["homes"]
	return ok && h
}

// policyList reports whether v is a list of policies (each with a name and
// a match), as a fragment of a policy file's policies shows them.
func policyList(v any) bool {
	l, ok := v.([]any)
	if !ok || len(l) == 0 {
		return false
	}
	for _, e := range l {
		m, ok := e.(map[string]any)
		if !ok || m["name"] == nil || m["match"] == nil {
			return false
		}
	}
	return true
}

// yamlBlocks returns the bodies of the ```yaml fences of a Markdown text.
func yamlBlocks(doc string) []string {
	var out []string
	for {
		_, rest, ok := strings.Cut(doc, "```yaml\n")
		if !ok {
			return out
		}
		block, after, _ := strings.Cut(rest, "```")
		out = append(out, block)
		doc = after
	}
}

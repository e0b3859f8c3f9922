package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/sizing"
)

// TestConfigCheckRoundTrips runs `config check` on every policy file the
// repository ships and loads what it prints: the printout must be a policy
// file the loader accepts, and mean exactly the policies of the original.
// That is what "the effective policies" promises: every setting in force,
// spelt as the file spells it.
func TestConfigCheckRoundTrips(t *testing.T) {
	examples := policyExamples(t, "../..")
	for _, ex := range examples {
		t.Run(ex.name, func(t *testing.T) {
			want, err := config.Parse(ex.name, ex.data)
			if err != nil {
				t.Fatalf("a shipped policy file does not load: %v", err)
			}
			path := filepath.Join(t.TempDir(), "policies.yaml")
			if err := os.WriteFile(path, ex.data, 0o600); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), []string{"config", "check", path}, func(string) string { return "" }, &stdout, &stderr); code != 0 {
				t.Fatalf("config check: exit %d\n%s", code, stderr.String())
			}
			got, err := config.Parse("printed", stdout.Bytes())
			if err != nil {
				t.Fatalf("the printout does not load:\n%v\n--- printout:\n%s", err, stdout.String())
			}
			if !reflect.DeepEqual(got, want) {
				for i := range max(len(got.Policies), len(want.Policies)) {
					switch {
					case i >= len(got.Policies):
						t.Errorf("policy %q is missing from the printout", want.Policies[i].Name)
					case i >= len(want.Policies):
						t.Errorf("the printout has an extra policy %q", got.Policies[i].Name)
					case !reflect.DeepEqual(got.Policies[i], want.Policies[i]):
						t.Errorf("policy %q differs once printed and loaded:\n got %+v\nwant %+v", want.Policies[i].Name, *got.Policies[i], *want.Policies[i])
					}
				}
				t.Logf("printout:\n%s", stdout.String())
			}
		})
	}
}

// example is one policy file the repository ships: a file of its own, the
// policy a Helm values file embeds, or a code block of the documentation.
type example struct {
	name string
	data []byte
}

// policyFileKeys are the top-level keys of a policy file
// (docs/configuration.md, "The document"); a YAML document whose keys are
// all among them is one.
var policyFileKeys = map[string]bool{"defaults": true, "policies": true, "default_policy": true}

// yamlBlock is a fenced YAML code block of a Markdown file.
var yamlBlock = regexp.MustCompile("(?ms)^```ya?ml\n(.*?)^```")

// policyExamples finds every policy file under root: YAML files whose
// top-level keys are a policy file's, the `policy` string of Helm values
// files, and the YAML code blocks of Markdown files shaped like a policy
// file (a block that elides with "…" is a sketch, not a file). Found by
// shape rather than listed, so a new example is covered when it is added.
func policyExamples(t *testing.T, root string) []example {
	t.Helper()
	var out []example
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// testdata holds test fixtures, broken files on purpose among
			// them, not files the repository ships (the go tool's own rule).
			if d.Name() == ".git" || d.Name() == "node_modules" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		switch filepath.Ext(path) {
		case ".yaml", ".yml":
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var top map[string]any
			if yaml.Unmarshal(data, &top) != nil || len(top) == 0 {
				return nil // a template, or several documents: not a policy file
			}
			if isPolicyFile(top) {
				out = append(out, example{rel, data})
			} else if s, ok := top["policy"].(string); ok && strings.Contains(filepath.Base(path), "values") {
				out = append(out, example{rel + "#policy", []byte(s)})
			}
		case ".md":
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range yamlBlock.FindAllSubmatchIndex(data, -1) {
				block := data[m[2]:m[3]]
				var top map[string]any
				if bytes.Contains(block, []byte("…")) || yaml.Unmarshal(block, &top) != nil || len(top) == 0 || !isPolicyFile(top) {
					continue
				}
				line := bytes.Count(data[:m[0]], []byte("\n")) + 1
				out = append(out, example{rel + ":" + strconv.Itoa(line), block})
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The finder must see what is known to be there, or it proves nothing.
	names := make([]string, 0, len(out))
	for _, ex := range out {
		names = append(names, ex.name)
	}
	all := strings.Join(names, " ")
	for _, known := range []string{"examples/policies.yaml", "examples/mcp-policies.yaml", "k8s/base/policy.yaml",
		"charts/idem-extproc/values.yaml#policy", "README.md:", "docs/mcp.md:", "docs/operations.md:"} {
		if !strings.Contains(all, known) {
			t.Errorf("policy example %s not found (found: %s)", known, all)
		}
	}
	return out
}

func isPolicyFile(top map[string]any) bool {
	for k := range top {
		if !policyFileKeys[k] {
			return false
		}
	}
	return true
}

// TestConfigCheckSizeAt: --size-at prints each policy's records at its
// rate and retention, times the measured bytes per record of the way it
// stores (internal/sizing), and refuses a rate it cannot read or a
// policy the file does not have.
func TestConfigCheckSizeAt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(path, []byte(`
policies:
  - name: payments
    match: {methods: [POST]}
    retention: 72h
    compression: {mode: off}
  - name: orders
    match: {methods: [PUT]}
default_policy: {enabled: false}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	args := []string{"config", "check", path, "--size-at", "100/s", "--size-at", "orders=2000"}
	if code := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	payments := 100 * 72 * 3600.0 // records
	orders := 2000 * 24 * 3600.0
	for _, want := range []string{
		"payments  uncompressed  72h  100  25920000  " + sizing.Human(payments*sizing.PerRecord["object"][sizing.Uncompressed]),
		"orders  auto  24h  2000  172800000  " + sizing.Human(orders*sizing.PerRecord["object"][sizing.Auto]),
		"total  198720000  " + sizing.Human(payments*sizing.PerRecord["object"][sizing.Uncompressed]+
			orders*sizing.PerRecord["object"][sizing.Auto]),
	} {
		if norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }; !strings.Contains(norm(out), norm(want)) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	for _, bad := range []string{"fast", "-3", "billing=5"} {
		stdout.Reset()
		stderr.Reset()
		code := run(context.Background(), []string{"config", "check", path, "--size-at", bad}, func(string) string { return "" }, &stdout, &stderr)
		if code != 1 || !strings.Contains(stderr.String(), "--size-at: \""+bad+"\"") {
			t.Errorf("--size-at %s: exit %d, %q", bad, code, stderr.String())
		}
	}
}

// TestConfigCheckNotesHomesReach: with a homes map, config check says how
// far from a scope's home a server may be before it refuses the scope's
// keys, for a home elsewhere and for each move, at the flags given.
func TestConfigCheckNotesHomesReach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("policies: []\nhomes:\n  epoch: 2\n  default: eu\n  rules:\n"+
		"    - {scopes: [acme], region: us, moved_from: ap, moved_at: '2026-12-02T10:00:00Z'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"config", "check", path}, func(string) string { return "" }, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{
		"a server more than 766.666666ms (round trip) from a scope's home refuses its keys",
		"while acme move from ap to us, a server more than 366.666666ms from both",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("no %q in:\n%s", want, stderr.String())
		}
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"config", "check", path, "--envoy-max-message-timeout", "0"},
		func(string) string { return "" }, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "a server more than 0s") {
		t.Errorf("without an extension: exit %d, %s", code, stderr.String())
	}
}

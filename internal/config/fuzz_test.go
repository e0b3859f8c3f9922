package config

import (
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// FuzzParse: no document makes Parse panic or hang, whatever it accepts
// is a policy set the server can run, and Marshal writes it as a file that
// Parse reads as the same set (config check's promise). (On this project's 2-core
// machines, run it with -fuzzminimizetime 0: the minimizer, not Parse,
// stalls on some inputs.)
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile(example); err == nil {
		f.Add(b)
	}
	for _, s := range printCases {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		"", "policies: []", "defaults: {lease: 1s, retention: 2s}",
		"policies:\n  - name: a\n    match: {path: {regex: '(a+)+$'}}\n",
		"defaults:\n  responses:\n    - {status: 5xx, origin: any, action: unknown}\n",
		"default_policy: {enabled: false}", "&a [*a]", "defaults: !!binary aGVsbG8=",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		type result struct {
			set *policy.Set
			err error
		}
		done := make(chan result, 1)
		go func() {
			set, err := Parse("fuzz.yaml", doc)
			done <- result{set, err}
		}()
		var r result
		select {
		case r = <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("Parse hangs on %q", doc)
		}
		if r.err != nil {
			return
		}
		names := map[string]bool{}
		for _, p := range r.set.Policies {
			if names[p.Name] {
				t.Fatalf("duplicate policy %q accepted", p.Name)
			}
			names[p.Name] = true
			if p.Lease <= 0 || p.Lease >= p.Retention || p.MaxRequestBody <= 0 || p.MaxKeyLength < 1 || p.MaxKeyLength > 255 {
				t.Fatalf("accepted an unworkable policy: %+v", p)
			}
		}
		out, err := Marshal(r.set)
		if err != nil {
			t.Fatalf("Marshal of an accepted set: %v", err)
		}
		again, err := Parse("printed.yaml", out)
		if err != nil {
			t.Fatalf("the printout of %q does not load: %v\n%s", doc, err, out)
		}
		if !reflect.DeepEqual(again, r.set) {
			t.Fatalf("the printout of %q loads as other policies:\n%s", doc, out)
		}
	})
}

package config

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

func TestHomes(t *testing.T) {
	set, err := Parse("homes.yaml", []byte(`
policies:
  - name: orders
    match: {methods: [POST]}
    scope: {from: header, header: x-tenant}
    retention: 2h
homes:
  epoch: 2
  default: eu
  rules:
    - {scopes: [acme, 'us-*'], region: us}
    - {scopes: [globex], region: ap, moved_from: eu, moved_at: '2026-11-30T10:00:00Z', lost: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := set.Policies[0]
	if p.Homes == nil || p.Homes != set.Homes || set.Homes.Epoch != 2 || set.Homes.KeyClockSkew != DefaultKeyClockSkew {
		t.Fatalf("homes = %+v", set.Homes)
	}
	moved := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		scope string
		at    time.Time
		want  string
		from  string
	}{
		{"acme", moved, "us", ""},
		{"us-17", moved, "us", ""},
		{"us", moved, "eu", ""}, // the prefix is "us-"
		{"initech", moved, "eu", ""},
		{"globex", moved.Add(3*time.Hour - time.Second), "ap", "eu"}, // within retention 2h + the margin
		{"globex", moved.Add(2*time.Hour + time.Hour + time.Second), "ap", ""},
	} {
		h := set.Homes.For(p, c.scope, c.at)
		if h.Region != c.want || h.From != c.from || (c.from != "" && !h.Lost) {
			t.Errorf("For(%q at %v) = %+v, want region %q from %q", c.scope, c.at, h, c.want, c.from)
		}
	}
	if got := strings.Join(set.Homes.Regions(), ","); got != "eu,us,ap" {
		t.Errorf("Regions() = %s", got)
	}
}

// TestHomesMistakes: each mistake in the homes section is reported at its
// line, with its path, all in one load.
func TestHomesMistakes(t *testing.T) {
	_, err := Parse("homes.yaml", []byte(`policies: []
homes:
  default: EU West
  rules:
    - {scopes: [acme], region: us}
    - {scopes: ['a*b', acme], region: us, moved_from: us}
    - {region: ap, lost: true}
    - {scopes: [zeta], moved_at: '2026-11-30T10:00:00Z'}
`))
	if err == nil {
		t.Fatal("loaded")
	}
	for _, want := range []string{
		`homes.yaml:3: homes.epoch: missing`,
		`homes.yaml:3: homes.default: "EU West" is not a region name`,
		`homes.yaml:6: homes.rules[1].scopes[0]: "a*b" is neither a scope nor a prefix`,
		`homes.yaml:6: homes.rules[1].scopes[1]: "acme" is already placed by homes.rules[0].scopes[0]`,
		`homes.yaml:6: homes.rules[1].moved_from: "us" is the rule's own region`,
		`homes.yaml:6: homes.rules[1].moved_at: missing`,
		`homes.yaml:7: homes.rules[2].scopes: missing`,
		`homes.yaml:7: homes.rules[2].lost: set without moved_from`,
		`homes.yaml:8: homes.rules[3].region: missing`,
		`homes.yaml:8: homes.rules[3].moved_at: set without moved_from`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}

// TestRegionsDocSnippets: every YAML snippet of docs/regions.md is a
// policy file this package loads (a snippet of the homes section alone
// with no policies), and the key_clock_skew comment says what
// configuration.md's row says.
func TestRegionsDocSnippets(t *testing.T) {
	doc, err := os.ReadFile("../../docs/regions.md")
	if err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	rest, n := string(doc), 0
	for {
		_, after, ok := strings.Cut(rest, "```yaml\n")
		if !ok {
			break
		}
		snippet, tail, _ := strings.Cut(after, "```")
		rest, n = tail, n+1
		if !strings.Contains(snippet, "policies:") {
			snippet = "policies: []\n" + snippet
		}
		if _, err := Parse(fmt.Sprintf("regions.md snippet %d", n), []byte(snippet)); err != nil {
			t.Errorf("%v\n%s", err, snippet)
		}
		for _, line := range strings.Split(snippet, "\n") {
			if _, comment, ok := strings.Cut(line, "key_clock_skew: 1m   # "); ok && !strings.Contains(string(conf), comment) {
				t.Errorf("regions.md says key_clock_skew is %q; configuration.md does not", comment)
			}
		}
	}
	if n < 3 {
		t.Errorf("found %d YAML snippets in docs/regions.md", n)
	}
}

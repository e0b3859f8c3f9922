package config

import (
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

package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// homesDoc is the homes section: which region's store arbitrates each
// scope's keys (policy.Homes, docs/regions.md).
type homesDoc struct {
	Epoch        scalar     `yaml:"epoch,omitempty"`
	Default      scalar     `yaml:"default,omitempty"`
	Rules        []homeRule `yaml:"rules,omitempty"`
	KeyClockSkew scalar     `yaml:"key_clock_skew,omitempty"`
}

type homeRule struct {
	Scopes    scalars `yaml:"scopes,omitempty"`
	Region    scalar  `yaml:"region,omitempty"`
	MovedFrom scalar  `yaml:"moved_from,omitempty"`
	MovedAt   scalar  `yaml:"moved_at,omitempty"`
	Lost      scalar  `yaml:"lost,omitempty"`
}

func (h *homesDoc) isSet() bool {
	return h.Epoch.Set || h.Default.Set || len(h.Rules) > 0 || h.KeyClockSkew.Set
}

// DefaultKeyClockSkew is homes.key_clock_skew when the file leaves it out.
const DefaultKeyClockSkew = time.Minute

// ValidRegion reports whether name is a region's name as the homes section
// and the server's flags write it (a policy name's form): it appears in
// flags, metrics labels and tombstones.
func ValidRegion(name string) bool { return namePattern.MatchString(name) }

// homes builds the homes section, or nil when the file has none.
func (b *builder) homes(h *homesDoc) *policy.Homes {
	if !h.isSet() {
		return nil
	}
	const path = "homes"
	out := &policy.Homes{KeyClockSkew: DefaultKeyClockSkew}
	line := firstSet(h.Epoch, h.Default, h.KeyClockSkew)
	if h.Epoch.Set {
		n, err := strconv.Atoi(strings.TrimSpace(h.Epoch.Value))
		if err != nil || n < 1 {
			b.errorf(h.Epoch.Line, path+".epoch", "%q is not a whole number from 1 up", h.Epoch.Value)
		}
		out.Epoch = n
	} else {
		b.errorf(line, path+".epoch", "missing; number the map, and give every change a larger epoch")
	}
	if h.Default.Set {
		out.Default = b.region(h.Default, path+".default")
	} else {
		b.errorf(line, path+".default", "missing; name the region that arbitrates the scopes no rule names")
	}
	if h.KeyClockSkew.Set {
		b.duration(&out.KeyClockSkew, h.KeyClockSkew, path+".key_clock_skew", 0)
	}
	seen := map[string]string{}
	for i := range h.Rules {
		r := &h.Rules[i]
		rp := b.entry(path+".rules", i)
		out.Rules = append(out.Rules, b.homeRule(r, rp, seen))
	}
	return out
}

func (b *builder) homeRule(r *homeRule, path string, seen map[string]string) policy.HomeRule {
	line := firstSet(r.Region, r.MovedFrom, r.MovedAt, r.Lost)
	if line == 0 {
		line = r.Scopes.Line
	}
	var out policy.HomeRule
	if len(r.Scopes.Items) == 0 {
		b.errorf(line, path+".scopes", "missing; list the scopes (exact, or a prefix ending in '*') this rule places")
	}
	for j, s := range r.Scopes.Items {
		sp := path + ".scopes[" + strconv.Itoa(j) + "]"
		if i := strings.IndexByte(s.Value, '*'); s.Value == "" || (i >= 0 && i != len(s.Value)-1) {
			b.errorf(s.Line, sp, "%q is neither a scope nor a prefix ending in one '*'", s.Value)
			continue
		}
		if prev, dup := seen[s.Value]; dup {
			b.errorf(s.Line, sp, "%q is already placed by %s; the first rule that matches wins", s.Value, prev)
		}
		seen[s.Value] = sp
		out.Scopes = append(out.Scopes, s.Value)
	}
	if r.Region.Set {
		out.Region = b.region(r.Region, path+".region")
	} else {
		b.errorf(line, path+".region", "missing; name the region that arbitrates these scopes")
	}
	if r.MovedFrom.Set {
		out.MovedFrom = b.region(r.MovedFrom, path+".moved_from")
		if out.MovedFrom == out.Region && out.Region != "" {
			b.errorf(r.MovedFrom.Line, path+".moved_from", "%q is the rule's own region", out.MovedFrom)
		}
		if r.MovedAt.Set {
			out.MovedAt = b.date(r.MovedAt, path+".moved_at")
		} else {
			b.errorf(r.MovedFrom.Line, path+".moved_at", "missing; a move needs the time it took effect (RFC 3339): the former home is asked about each key until its window ends")
		}
	} else if r.MovedAt.Set {
		b.errorf(r.MovedAt.Line, path+".moved_at", "set without moved_from")
	}
	if r.Lost.Set {
		b.boolean(&out.Lost, r.Lost, path+".lost")
		if out.Lost && !r.MovedFrom.Set {
			b.errorf(r.Lost.Line, path+".lost", "set without moved_from: name the region declared lost")
		}
	}
	return out
}

func (b *builder) region(v scalar, path string) string {
	if !ValidRegion(v.Value) {
		b.errorf(v.Line, path, "%q is not a region name (1 to 63 lower-case letters, digits, '.', '_' or '-')", v.Value)
	}
	return v.Value
}

// unhomes is homes backwards, for Marshal.
func unhomes(h *policy.Homes) homesDoc {
	if h == nil {
		return homesDoc{}
	}
	// key_clock_skew is written even at its default: config check shows
	// what a failover's keys are judged by.
	doc := homesDoc{Epoch: intScalar(h.Epoch), Default: str(h.Default), KeyClockSkew: durScalar(h.KeyClockSkew)}
	for _, r := range h.Rules {
		hr := homeRule{Scopes: list(r.Scopes), Region: str(r.Region)}
		if r.MovedFrom != "" {
			hr.MovedFrom = str(r.MovedFrom)
			hr.MovedAt = str(r.MovedAt.UTC().Format(time.RFC3339Nano))
		}
		if r.Lost {
			hr.Lost = boolScalar(true)
		}
		doc.Rules = append(doc.Rules, hr)
	}
	return doc
}

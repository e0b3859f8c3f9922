package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// scalar is one YAML scalar with its position, so a value found wrong
// after decoding can still be reported at its line.
type scalar struct {
	Value string
	Line  int
	Set   bool
}

func (s *scalar) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: expected a single value, found a %s", n.Line, kindName(n.Kind))
	}
	*s = scalar{Value: n.Value, Line: n.Line, Set: true}
	return nil
}

// scalars is a YAML sequence of scalars (a single scalar is accepted as a
// one-element list).
type scalars struct {
	Items []scalar
	Line  int
	Set   bool
}

func (s *scalars) UnmarshalYAML(n *yaml.Node) error {
	s.Line, s.Set = n.Line, true
	switch n.Kind {
	case yaml.ScalarNode:
		s.Items = []scalar{{Value: n.Value, Line: n.Line, Set: true}}
		return nil
	case yaml.SequenceNode:
		for _, c := range n.Content {
			var v scalar
			if err := v.UnmarshalYAML(c); err != nil {
				return err
			}
			s.Items = append(s.Items, v)
		}
		return nil
	}
	return fmt.Errorf("line %d: expected a list, found a %s", n.Line, kindName(n.Kind))
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	}
	return "scalar"
}

// document is the configuration file as written.
type document struct {
	// Defaults are settings every policy starts from (the built-in defaults
	// fill what it leaves out).
	Defaults settings `yaml:"defaults"`
	// Policies are matched in order; the first that matches applies.
	Policies []namedPolicy `yaml:"policies"`
	// DefaultPolicy protects what no listed policy matches.
	DefaultPolicy defaultPolicy `yaml:"default_policy"`
}

// Structs below have no UnmarshalYAML of their own: yaml.v3's Node.Decode
// would drop the decoder's KnownFields setting inside them, and unknown
// fields must be reported everywhere.

type namedPolicy struct {
	Name     scalar `yaml:"name"`
	Match    match  `yaml:"match"`
	settings `yaml:",inline"`
}

type defaultPolicy struct {
	Enabled  scalar `yaml:"enabled"`
	Match    match  `yaml:"match"`
	settings `yaml:",inline"`
}

type match struct {
	RouteNames scalars   `yaml:"route_names"`
	Hosts      scalars   `yaml:"hosts"`
	Methods    scalars   `yaml:"methods"`
	Path       pathMatch `yaml:"path"`
	// JSON are body criteria, decided at the request body (issue 18).
	JSON []jsonCriterion `yaml:"json"`
}

type jsonCriterion struct {
	Pointer scalar  `yaml:"pointer"`
	Equals  scalar  `yaml:"equals"`
	OneOf   scalars `yaml:"one_of"`
}

type pathMatch struct {
	Exact  scalar `yaml:"exact"`
	Prefix scalar `yaml:"prefix"`
	Regex  scalar `yaml:"regex"`
}

// settings are everything a policy says about how it protects.
type settings struct {
	Key             keySettings      `yaml:"key"`
	Scope           scopeSettings    `yaml:"scope"`
	Retention       scalar           `yaml:"retention"`
	Lease           scalar           `yaml:"lease"`
	RetryAfter      scalar           `yaml:"retry_after"`
	MaxRequestBody  scalar           `yaml:"max_request_body"`
	MaxStoredBody   scalar           `yaml:"max_stored_body"`
	StoreFailure    scalar           `yaml:"store_failure"`
	Fingerprint     fingerprintCfg   `yaml:"fingerprint"`
	Responses       []responseRule   `yaml:"responses"`
	OnStreamReset   scalar           `yaml:"on_stream_reset"`
	OnLeaseExpiry   scalar           `yaml:"on_lease_expiry"`
	StoredHeaders   storedHeadersCfg `yaml:"stored_headers"`
	WaitForInFlight scalar           `yaml:"wait_for_in_flight"`
	Encrypt         scalar           `yaml:"encrypt"`
	Durability      scalar           `yaml:"durability"`
	DurabilityReps  scalar           `yaml:"durability_replicas"`
	DurabilityWait  scalar           `yaml:"durability_timeout"`
	Enforcement     scalar           `yaml:"enforcement"`
	ShadowHeader    scalar           `yaml:"shadow_header"`
	AdoptShadow     scalar           `yaml:"adopt_shadow_records"`
	Answers         scalar           `yaml:"answers"`
}

type keySettings struct {
	Header    scalar `yaml:"header"`
	Required  scalar `yaml:"required"`
	MaxLength scalar `yaml:"max_length"`
	WarnUntil scalar `yaml:"warn_until"`
	// From, Pointer and Derive draw the key from the body (issue 18).
	From    scalars `yaml:"from"`
	Pointer scalar  `yaml:"pointer"`
	Derive  scalars `yaml:"derive"`
}

type scopeSettings struct {
	From         scalar      `yaml:"from"`
	Header       scalar      `yaml:"header"`
	Metadata     metadataRef `yaml:"metadata"`
	PeerIdentity scalar      `yaml:"peer_identity"`
}

type metadataRef struct {
	Namespace scalar  `yaml:"namespace"`
	Path      scalars `yaml:"path"`
}

type fingerprintCfg struct {
	Headers scalars `yaml:"headers"`
	JSON    scalar  `yaml:"json"`
	Include scalars `yaml:"include"`
	Exclude scalars `yaml:"exclude"`
}

type responseRule struct {
	Status scalar `yaml:"status"`
	Origin scalar `yaml:"origin"`
	Action scalar `yaml:"action"`
}

type storedHeadersCfg struct {
	Deny scalars `yaml:"deny"`
}

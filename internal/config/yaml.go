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
	// Tag, when Marshal sets it (!!bool, !!int), writes Value plain; a
	// scalar without one is written as a YAML string, quoted when it would
	// read as something else. Decoding leaves it empty.
	Tag string
}

// IsZero leaves a setting the printer did not set out of the file
// (omitempty).
func (s scalar) IsZero() bool { return !s.Set }

func (s scalar) MarshalYAML() (any, error) { return s.node() }

func (s scalar) node() (*yaml.Node, error) {
	if s.Tag != "" {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: s.Tag, Value: s.Value}, nil
	}
	var n yaml.Node
	return &n, n.Encode(s.Value)
}

func (s *scalar) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return wrongKind(n, "a single value")
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
	return wrongKind(n, "a list")
}

// wrongKind reports a value of the wrong kind as a yaml.TypeError, which
// yaml.v3 collects and decodes on after; any other error from an
// UnmarshalYAML stops it at the first mistake (go.yaml.in/yaml/v3
// decode.go, decoder.callUnmarshaler). The column lets decodeProblems name
// the field.
func wrongKind(n *yaml.Node, want string) error {
	return &yaml.TypeError{Errors: []string{
		fmt.Sprintf("line %d: column %d: expected %s, found a %s", n.Line, n.Column, want, kindName(n.Kind))}}
}

func (s scalars) IsZero() bool { return !s.Set }

// MarshalYAML writes the list on one line, as the examples do.
func (s scalars) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, v := range s.Items {
		c, err := v.node()
		if err != nil {
			return nil, err
		}
		n.Content = append(n.Content, c)
	}
	return n, nil
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
	Defaults settings `yaml:"defaults,omitempty"`
	// Policies are matched in order; the first that matches applies.
	Policies []namedPolicy `yaml:"policies"`
	// DefaultPolicy protects what no listed policy matches.
	DefaultPolicy defaultPolicy `yaml:"default_policy,omitempty"`
	// Homes places each scope's keys in one region's store, for a fleet
	// in several regions.
	Homes homesDoc `yaml:"homes,omitempty"`
}

// Structs below have no UnmarshalYAML of their own: yaml.v3's Node.Decode
// would drop the decoder's KnownFields setting inside them, and unknown
// fields must be reported everywhere.

type namedPolicy struct {
	Name     scalar `yaml:"name,omitempty"`
	Match    match  `yaml:"match,omitempty"`
	settings `yaml:",inline"`
}

type defaultPolicy struct {
	Enabled  scalar `yaml:"enabled,omitempty"`
	Match    match  `yaml:"match,omitempty"`
	settings `yaml:",inline"`
}

type match struct {
	RouteNames scalars   `yaml:"route_names,omitempty"`
	Hosts      scalars   `yaml:"hosts,omitempty"`
	Methods    scalars   `yaml:"methods,omitempty"`
	Path       pathMatch `yaml:"path,omitempty"`
	// JSON are body criteria, decided at the request body.
	JSON []jsonCriterion `yaml:"json,omitempty"`
}

type jsonCriterion struct {
	Pointer scalar  `yaml:"pointer,omitempty"`
	Equals  scalar  `yaml:"equals,omitempty"`
	OneOf   scalars `yaml:"one_of,omitempty"`
}

type pathMatch struct {
	Exact  scalar `yaml:"exact,omitempty"`
	Prefix scalar `yaml:"prefix,omitempty"`
	Regex  scalar `yaml:"regex,omitempty"`
}

// settings are everything a policy says about how it protects.
type settings struct {
	Key             keySettings      `yaml:"key,omitempty"`
	Scope           scopeSettings    `yaml:"scope,omitempty"`
	Retention       scalar           `yaml:"retention,omitempty"`
	Lease           scalar           `yaml:"lease,omitempty"`
	RetryAfter      scalar           `yaml:"retry_after,omitempty"`
	MaxRequestBody  scalar           `yaml:"max_request_body,omitempty"`
	MaxStoredBody   scalar           `yaml:"max_stored_body,omitempty"`
	StoreFailure    scalar           `yaml:"store_failure,omitempty"`
	Fingerprint     fingerprintCfg   `yaml:"fingerprint,omitempty"`
	Responses       []responseRule   `yaml:"responses"`
	OnStreamReset   scalar           `yaml:"on_stream_reset,omitempty"`
	OnLeaseExpiry   scalar           `yaml:"on_lease_expiry,omitempty"`
	StoredHeaders   storedHeadersCfg `yaml:"stored_headers,omitempty"`
	Compression     compressionCfg   `yaml:"compression,omitempty"`
	WaitForInFlight scalar           `yaml:"wait_for_in_flight,omitempty"`
	Encrypt         scalar           `yaml:"encrypt,omitempty"`
	Durability      scalar           `yaml:"durability,omitempty"`
	DurabilityReps  scalar           `yaml:"durability_replicas,omitempty"`
	DurabilityWait  scalar           `yaml:"durability_timeout,omitempty"`
	Enforcement     scalar           `yaml:"enforcement,omitempty"`
	ShadowHeader    scalar           `yaml:"shadow_header,omitempty"`
	AdoptShadow     scalar           `yaml:"adopt_shadow_records,omitempty"`
	Answers         scalar           `yaml:"answers,omitempty"`
	MCPHeaders      scalar           `yaml:"mcp_headers,omitempty"`
	Tools           toolsCfg         `yaml:"tools,omitempty"`
}

// toolsCfg is the tools group of a JSON-RPC policy on an MCP server.
type toolsCfg struct {
	Protect       scalar `yaml:"protect,omitempty"`
	HintTTL       scalar `yaml:"hint_ttl,omitempty"`
	HintCacheSize scalar `yaml:"hint_cache_size,omitempty"`
	Advertise     scalar `yaml:"advertise_idempotent,omitempty"`
}

type keySettings struct {
	Header    scalar `yaml:"header,omitempty"`
	Required  scalar `yaml:"required,omitempty"`
	MaxLength scalar `yaml:"max_length,omitempty"`
	WarnUntil scalar `yaml:"warn_until,omitempty"`
	// From, Pointer, Derive and Param draw the key from the body (Param:
	// an MCP tool parameter, whose mirrored header is checked).
	From    scalars `yaml:"from,omitempty"`
	Pointer scalar  `yaml:"pointer,omitempty"`
	Derive  scalars `yaml:"derive,omitempty"`
	Param   scalar  `yaml:"param,omitempty"`
}

type scopeSettings struct {
	From         scalar      `yaml:"from,omitempty"`
	Header       scalar      `yaml:"header,omitempty"`
	Metadata     metadataRef `yaml:"metadata,omitempty"`
	PeerIdentity scalar      `yaml:"peer_identity,omitempty"`
}

type metadataRef struct {
	Namespace scalar  `yaml:"namespace,omitempty"`
	Path      scalars `yaml:"path,omitempty"`
}

type fingerprintCfg struct {
	Headers scalars `yaml:"headers,omitempty"`
	JSON    scalar  `yaml:"json,omitempty"`
	Include scalars `yaml:"include,omitempty"`
	Exclude scalars `yaml:"exclude,omitempty"`
}

type responseRule struct {
	Status scalar `yaml:"status,omitempty"`
	Origin scalar `yaml:"origin,omitempty"`
	Action scalar `yaml:"action,omitempty"`
}

type storedHeadersCfg struct {
	Deny scalars `yaml:"deny,omitempty"`
}

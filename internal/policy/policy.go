// Package policy says which requests are protected and how: the key's
// rules, its scope, retention and lease, what is stored, and what to do
// when the store fails.
package policy

import (
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
)

// ScopeSource names where a key's scope (its owner) comes from.
type ScopeSource uint8

const (
	// ScopeAuthority scopes keys by the request's :authority (host), so two
	// APIs behind one proxy never share a key space.
	ScopeAuthority ScopeSource = iota
	// ScopeNone puts every key of the policy in one space.
	ScopeNone
	// ScopeHeader takes the scope from a header set by a trusted earlier
	// filter.
	ScopeHeader
	// ScopeMetadata takes it from Envoy dynamic metadata forwarded in
	// metadata_context, e.g. jwt_authn's payload "sub".
	ScopeMetadata
	// ScopePrincipal takes it from the downstream peer certificate, as
	// Envoy's connection.*_peer_certificate attributes carry it (see
	// PeerIdentity).
	ScopePrincipal
)

// PeerIdentity picks which part of the peer certificate is the principal.
type PeerIdentity uint8

const (
	// PeerURISAN is the first URI SAN (a SPIFFE ID):
	// connection.uri_san_peer_certificate.
	PeerURISAN PeerIdentity = iota
	// PeerDNSSAN is the first DNS SAN: connection.dns_san_peer_certificate.
	PeerDNSSAN
	// PeerSubject is the subject DN: connection.subject_peer_certificate.
	PeerSubject
)

// Scope says how a policy scopes keys.
type Scope struct {
	Source ScopeSource
	// Header is the header name for ScopeHeader (lower case).
	Header string
	// Namespace and Path locate the value for ScopeMetadata.
	Namespace string
	Path      []string
	// PeerIdentity picks the certificate field for ScopePrincipal.
	PeerIdentity PeerIdentity
}

// FailureMode says what happens when the store cannot be asked.
type FailureMode uint8

const (
	// FailClosed answers 503: never let a write through unprotected.
	FailClosed FailureMode = iota
	// FailOpen lets the request through unprotected, counted and logged.
	FailOpen
)

// Durability says when a reservation counts as made.
type Durability uint8

const (
	// DurabilityAsync: the reservation counts once the Redis primary has
	// it. Redis replicates asynchronously, so a failover right after can
	// lose it and let a retry run the operation a second time.
	DurabilityAsync Durability = iota
	// DurabilityReplicated: the request goes upstream only after
	// DurabilityReplicas replicas confirmed the reservation (Redis WAIT)
	// within DurabilityTimeout. If they do not, the reservation is released
	// and the request is answered like a store failure (503 when failing
	// closed). It costs about one replication round trip per reservation.
	DurabilityReplicated
)

func (d Durability) String() string { return idem.EnumName(d, "async", "replicated") }

// Enforcement says how far a policy acts on its decisions, so that
// idempotency can be rolled out to APIs whose clients never sent keys:
// off, then shadow, then enforce.
type Enforcement uint8

const (
	// EnforcementEnforce acts on every decision: replays, 409, 422, 400.
	EnforcementEnforce Enforcement = iota
	// EnforcementShadow makes every decision against the store, records
	// and counts it, but never answers in the upstream's place: every
	// request goes on. Its records live in their own key space
	// (RecordNamespace).
	EnforcementShadow
	// EnforcementOff matches requests but does nothing with them: no store
	// call; they are only counted (with or without a key).
	EnforcementOff
)

func (e Enforcement) String() string { return idem.EnumName(e, "enforce", "shadow", "off") }

// ShadowNamespaceSuffix is appended to a policy's name to derive the record
// ids of its shadow phase. Policy names cannot contain '#', so the two key
// spaces never meet unless an enforcing policy adopts the shadow one.
const ShadowNamespaceSuffix = "#shadow"

// Defaults of DurabilityReplicated.
const (
	DefaultDurabilityReplicas = 1
	// DefaultDurabilityTimeout leaves room for the reservation itself
	// within the default 100 ms store budget.
	DefaultDurabilityTimeout = 50 * time.Millisecond
)

// Policy is one set of rules, in the groups the policy file documents them
// in (docs/configuration.md): each group is parsed and checked together
// (internal/config). The groups are embedded, so a rule reads as p.Lease
// wherever it is used.
type Policy struct {
	Name string
	// Match selects the requests the policy protects.
	Match Match
	KeyRules
	Scope Scope
	BodyRules
	DurabilityRules
	RolloutRules
	Responses
	// Answers is the protocol of the answers made in the upstream's
	// place: HTTP (the default) or JSON-RPC (answers: jsonrpc).
	Answers Answers
	// MCPHeaders says what a JSON-RPC policy makes of the headers MCP
	// 2026-07-28 mirrors the body in (mcp_headers, mcp.go).
	MCPHeaders MCPHeadersMode
	// Tools says which MCP tool calls a JSON-RPC policy protects, by the
	// tools' annotations (tools, tools.go).
	Tools ToolRules
	// Homes is the set's map of scopes to regions (Set.Homes); nil when
	// every key lives in the server's own store.
	Homes *Homes
}

// KeyRules are the key group: key.header, key.required, key.max_length,
// key.warn_until.
type KeyRules struct {
	// KeyHeader is the lower-case header carrying the key.
	KeyHeader string
	// KeyRequired makes a missing key a 400 instead of a pass-through.
	KeyRequired bool
	// KeyWarnUntil, when set with KeyRequired, is the end of a grace
	// period: before it a request without a key passes with a Warning
	// header (and is counted); from it on, it is refused with 400.
	KeyWarnUntil time.Time
	MaxKeyLength int
	BodyKeyRules
}

// BodyRules are the bodies group: what of a request is fingerprinted and
// what of a response is kept (max_request_body, max_stored_body,
// fingerprint, stored_headers).
type BodyRules struct {
	// MaxRequestBody bounds the request body read for the fingerprint.
	MaxRequestBody int
	// MaxStoredBody bounds a stored response body; a larger response is
	// recorded as completed without its body.
	MaxStoredBody int
	// FingerprintHeaders are the request headers that take part in the
	// fingerprint, normalised by fingerprint.Normalize.
	FingerprintHeaders []string
	// FingerprintJSON canonicalises a JSON body before fingerprinting, so
	// key order and insignificant whitespace do not make a retry differ.
	FingerprintJSON bool
	// FingerprintInclude and FingerprintExclude narrow a JSON body's
	// fingerprint by pointer (fingerprint.include, fingerprint.exclude;
	// FingerprintJSON must be on).
	FingerprintInclude, FingerprintExclude []jsonpointer.Pointer
	// StoredHeaderDeny lists response headers never stored or replayed, on
	// top of the hop-by-hop ones (lower case).
	StoredHeaderDeny []string
	// Compression says how stored responses are compressed (compression).
	Compression Compression
}

// Compression is the compression group: compression.mode,
// compression.dictionary, compression.previous_dictionaries.
type Compression struct {
	// Mode is how new responses are compressed (compression.mode); the
	// records compressed before expand whatever it is.
	Mode compress.Mode
	// Dictionary is the file of the zstd dictionary that compresses new
	// responses, as the configuration names it; empty for the built-in
	// one.
	Dictionary string
	// PreviousDictionaries are the files of dictionaries used before,
	// kept so that the records they compressed still expand.
	PreviousDictionaries []string
	// Codec compresses and expands the policy's responses as the fields
	// above say (internal/config makes it). Nil stores every response
	// uncompressed and expands none.
	Codec idem.Compressor
}

// maxHeaderBytes bounds the headers an expanded response may carry
// beside its body. It is this project's own margin, chosen generous: it
// only keeps a record changed in the store from expanding without bound.
const maxHeaderBytes = 8 << 20

// MaxExpanded bounds what a compressed record of the policy may expand
// to: its stored body and headers, and never less than the default body
// limit, so that lowering max_stored_body does not strand the larger
// answers stored before.
func (p *Policy) MaxExpanded() int {
	return max(p.MaxStoredBody, DefaultMaxBody) + maxHeaderBytes
}

// DurabilityRules are the durability group: how long a record lives, how
// sure its reservation is, what a store failure does, and how it is kept
// (retention, lease, on_lease_expiry, store_failure, durability,
// durability_replicas, durability_timeout, encrypt).
type DurabilityRules struct {
	Retention   time.Duration
	Lease       time.Duration
	LeaseExpiry idem.LeaseExpiry
	FailureMode FailureMode
	// Durability says whether a reservation must reach replicas before
	// the request goes upstream (config: durability: replicated), with
	// DurabilityReplicas (default 1) and DurabilityTimeout (default 50 ms,
	// keep it under the store budget) for DurabilityReplicated.
	Durability         Durability
	DurabilityReplicas int
	DurabilityTimeout  time.Duration
	// Encrypt seals stored responses (headers and body) with the server's
	// key ring (package seal), so a copy of the store reveals only
	// statuses.
	Encrypt bool
}

// RolloutRules are the rollout group: enforcement, shadow_header,
// adopt_shadow_records (docs/design.md §9).
type RolloutRules struct {
	// Enforcement is off, shadow or enforce (the zero value).
	Enforcement Enforcement
	// ShadowHeader, when set, names a response header that tells the
	// client what a shadow policy would have done ("would-replay", ...).
	// Only shadow policies add it; HTTP only.
	ShadowHeader string
	// AdoptShadowRecords makes an enforcing policy keep its records in the
	// key space of its shadow phase, so the responses the shadow stored
	// are replayed. Off, enforcement starts with a clean key space.
	AdoptShadowRecords bool
}

// Responses are the responses group: what a response proves (responses,
// on_stream_reset) and how a duplicate is answered (retry_after,
// wait_for_in_flight).
type Responses struct {
	ResponseRules []idem.ResponseRule
	// OnStreamReset is what happens when the stream ends after the
	// reservation and before any response: ActionUnknown or ActionRelease.
	OnStreamReset idem.Action
	RetryAfter    time.Duration
	// WaitForInFlight, when positive, makes a duplicate that arrives while
	// the first attempt runs wait up to this long for its answer and
	// replay it, instead of answering 409 at once.
	WaitForInFlight time.Duration
}

// Defaults of the default policy, docs/design.md §1-§5.
const (
	DefaultRetention      = 24 * time.Hour
	DefaultLease          = 30 * time.Second
	DefaultRetryAfter     = time.Second
	DefaultMaxBody        = 1 << 20
	DefaultKeyHeader      = idem.KeyHeader
	DefaultPolicyName     = "default"
	DefaultFingerprintHdr = "content-type"
)

// Default returns the policy used when no configuration is given: POST and
// PATCH with an optional Idempotency-Key (from the header), scoped by :authority, kept 24 h,
// a 30 s lease, 1 MiB bodies compressed with the built-in dictionary, failing closed.
func Default() *Policy {
	p := &Policy{
		Name:  DefaultPolicyName,
		Match: Match{Methods: []string{"POST", "PATCH"}},
		KeyRules: KeyRules{
			KeyHeader:    DefaultKeyHeader,
			MaxKeyLength: idem.MaxKeyLength,
			BodyKeyRules: BodyKeyRules{KeySources: []KeySource{KeyFromHeader}},
		},
		Scope: Scope{Source: ScopeAuthority},
		BodyRules: BodyRules{
			MaxRequestBody:     DefaultMaxBody,
			MaxStoredBody:      DefaultMaxBody,
			FingerprintHeaders: fingerprint.Normalize([]string{DefaultFingerprintHdr}),
		},
		DurabilityRules: DurabilityRules{
			Retention:   DefaultRetention,
			Lease:       DefaultLease,
			LeaseExpiry: idem.LeaseExpiryUnknown,
			FailureMode: FailClosed,
		},
		Responses: Responses{
			ResponseRules: idem.DefaultResponseRules(),
			OnStreamReset: idem.ActionUnknown,
			RetryAfter:    DefaultRetryAfter,
		},
		Tools: ToolRules{HintTTL: DefaultToolHintTTL, HintCacheSize: DefaultToolHintCacheSize},
	}
	// New refuses only dictionaries it is not given here
	// (TestDefaultCompresses): should it ever fail, the policy stores
	// answers as they come, which costs memory and nothing else.
	if c, err := compress.New(compress.Options{}); err == nil {
		p.Compression.Codec = c
	}
	return p
}

// RecordNamespace is the name a policy's record ids derive from (see
// idem.RecordIDFor): its own name, or name+ShadowNamespaceSuffix for a
// shadow policy and for an enforcing one that adopts its shadow records.
func (p *Policy) RecordNamespace() string {
	if p.Enforcement == EnforcementShadow || (p.Enforcement == EnforcementEnforce && p.AdoptShadowRecords) {
		return p.Name + ShadowNamespaceSuffix
	}
	return p.Name
}

// KeyGrace reports whether a request without a required key is, at now,
// still in the policy's warning phase (key.warn_until).
func (p *Policy) KeyGrace(now time.Time) bool {
	return p.KeyRequired && !p.KeyWarnUntil.IsZero() && now.Before(p.KeyWarnUntil)
}

// WaitReplicas returns how many replicas must confirm a reservation, and
// how long to wait for them: none for DurabilityAsync.
func (p *Policy) WaitReplicas() (int, time.Duration) {
	if p.Durability != DurabilityReplicated {
		return 0, 0
	}
	n, d := p.DurabilityReplicas, p.DurabilityTimeout
	if n <= 0 {
		n = DefaultDurabilityReplicas
	}
	if d <= 0 {
		d = DefaultDurabilityTimeout
	}
	return n, d
}

// hopByHop are never stored: they describe one connection, not the answer
// (RFC 9110 §7.6.1), or are recomputed by whoever sends the replay.
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "transfer-encoding": true, "te": true,
	"trailer": true, "upgrade": true, "proxy-connection": true,
	"proxy-authenticate": true, "proxy-authorization": true,
	// Envoy sets these itself on the replay, and Date must be fresh.
	"content-length": true, "date": true,
}

// ReservedHeader reports whether a response header belongs to the
// connection or to Envoy (hop-by-hop, pseudo, proxy-*, x-envoy-*,
// content-length, date): never stored, replayed nor added by the server.
// name must be lower case.
func ReservedHeader(name string) bool {
	return hopByHop[name] || strings.HasPrefix(name, ":") || strings.HasPrefix(name, "proxy-") ||
		strings.HasPrefix(name, "x-envoy-") // Envoy's own, and immutable by ext_proc
}

// StoresHeader reports whether a response header is kept in a record.
// name must be lower case.
func (p *Policy) StoresHeader(name string) bool {
	if ReservedHeader(name) {
		return false
	}
	if p.Answers == AnswersJSONRPC && name == MCPSessionHeader {
		// A replay goes to a retry that may come in another session; the
		// MCP Go SDK client fails a connection whose response names a
		// session other than its own (go-sdk v1.8.0 mcp/streamable.go,
		// streamableClientConn.Write, "mismatching session IDs").
		return false
	}
	for _, d := range p.StoredHeaderDeny {
		if d == name {
			return false
		}
	}
	return true
}

package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// enum is the file's names for the values of one setting, read by the
// loader (oneOf) and written by Marshal (name) from the same table, so the
// two cannot spell a value differently.
type enum[T comparable] []struct {
	name  string
	value T
}

func (e enum[T]) parse(s string) (T, bool) {
	for _, c := range e {
		if c.name == s {
			return c.value, true
		}
	}
	var zero T
	return zero, false
}

// name returns the file's name for v.
func (e enum[T]) name(v T) (scalar, error) {
	for _, c := range e {
		if c.value == v {
			return str(c.name), nil
		}
	}
	return scalar{}, fmt.Errorf("%v has no name in a policy file", v)
}

func (e enum[T]) names() []string {
	out := make([]string, 0, len(e))
	for _, c := range e {
		out = append(out, c.name)
	}
	return out
}

var (
	keySources = enum[policy.KeySource]{
		{"header", policy.KeyFromHeader}, {"body", policy.KeyFromBody}, {"derived", policy.KeyFromDerived},
		{"mcp_param", policy.KeyFromMCPParam}}
	scopeSources = enum[policy.ScopeSource]{
		{"authority", policy.ScopeAuthority}, {"none", policy.ScopeNone}, {"header", policy.ScopeHeader},
		{"metadata", policy.ScopeMetadata}, {"principal", policy.ScopePrincipal}}
	peerIdentities = enum[policy.PeerIdentity]{
		{"uri_san", policy.PeerURISAN}, {"dns_san", policy.PeerDNSSAN}, {"subject", policy.PeerSubject}}
	answerModes    = enum[policy.Answers]{{"http", policy.AnswersHTTP}, {"jsonrpc", policy.AnswersJSONRPC}}
	mcpHeaderModes = enum[policy.MCPHeadersMode]{{"check", policy.MCPHeadersCheck}, {"trust", policy.MCPHeadersTrust}}
	toolsProtects  = enum[policy.ToolsProtect]{{"all", policy.ToolsAll}, {"unless_hinted", policy.ToolsUnlessHinted}}
	leaseExpiries  = enum[idem.LeaseExpiry]{
		{"unknown", idem.LeaseExpiryUnknown}, {"reexecute", idem.LeaseExpiryReexecute}}
	failureModes = enum[policy.FailureMode]{{"fail_closed", policy.FailClosed}, {"fail_open", policy.FailOpen}}
	durabilities = enum[policy.Durability]{
		{"async", policy.DurabilityAsync}, {"replicated", policy.DurabilityReplicated}}
	enforcements = enum[policy.Enforcement]{
		{"enforce", policy.EnforcementEnforce}, {"shadow", policy.EnforcementShadow}, {"off", policy.EnforcementOff}}
)

// oneOf reads a value that must be one of e's names.
func oneOf[T comparable](b *builder, v scalar, path string, e enum[T]) T {
	x, ok := e.parse(v.Value)
	if !ok {
		b.errorf(v.Line, path, "%q is not one of %s", v.Value, strings.Join(e.names(), ", "))
	}
	return x
}

// The readers below set *dst only when the value is right: a wrong one
// leaves the setting as it was (from defaults: or built in), so the checks
// that compare settings judge what is in force rather than a zero nobody
// wrote (`lease 30s must be shorter than retention 0s` after `retention:
// later`).

func (b *builder) boolean(dst *bool, v scalar, path string) {
	x, err := strconv.ParseBool(v.Value)
	if err != nil {
		b.errorf(v.Line, path, "%q is not true or false", v.Value)
		return
	}
	*dst = x
}

func (b *builder) duration(dst *time.Duration, v scalar, path string, min time.Duration) {
	d, err := time.ParseDuration(v.Value)
	switch {
	case err != nil:
		b.errorf(v.Line, path, "%q is not a duration (such as 30s, 5m, 24h; the largest unit is h: write 7 days as 168h)", v.Value)
	case d < min || d < 0:
		b.errorf(v.Line, path, "%v is below the minimum %v", d, min)
	default:
		*dst = d
	}
}

// date reads an RFC 3339 date-time, or a full date meaning its first
// instant in UTC.
func (b *builder) date(v scalar, path string) time.Time {
	s := strings.TrimSpace(v.Value)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t
	}
	b.errorf(v.Line, path, "%q is not an RFC 3339 date (2026-03-01) or date-time (2026-03-01T09:00:00Z)", v.Value)
	return time.Time{}
}

// size reads a byte count: a number, or a number with KiB, MiB or GiB, or
// with Ki, Mi or Gi as Kubernetes writes the same units.
func (b *builder) size(dst *int, v scalar, path string) {
	s := strings.TrimSpace(v.Value)
	mult := 1
	for suffix, m := range map[string]int{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(s, suffix); ok {
			s, mult = strings.TrimSpace(n), m
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > (1<<31)/mult {
		b.errorf(v.Line, path, "%q is not a size (a byte count, or with KiB, MiB or GiB, or Ki, Mi, Gi; up to 2GiB)", v.Value)
		return
	}
	*dst = n * mult
}

// shortDuration writes d as a file would: 2h, 1h30m, 90s, not 2h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

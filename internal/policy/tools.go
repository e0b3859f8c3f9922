package policy

import (
	"slices"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/toolhints"
)

// ToolsProtect says which MCP tool calls a JSON-RPC policy protects
// (tools.protect).
type ToolsProtect uint8

const (
	// ToolsAll: every request the body criteria take (the default).
	ToolsAll ToolsProtect = iota
	// ToolsUnlessHinted: only tools/call requests, and of those every one
	// the body criteria take but a call of a tool the upstream's last
	// tools/list said is read-only (readOnlyHint: true) or idempotent
	// (idempotentHint: true). A tool not listed, or listed longer ago than
	// the list's ttlMs (or tools.hint_ttl), is protected.
	ToolsUnlessHinted
)

// Defaults of tools.hint_ttl and tools.hint_cache_size.
const (
	DefaultToolHintTTL       = 5 * time.Minute
	DefaultToolHintCacheSize = 4096
)

// ToolRules are the tools group: tools.protect, tools.hint_ttl,
// tools.hint_cache_size.
type ToolRules struct {
	Protect ToolsProtect
	// HintTTL is how long a list's annotations are kept when it gives no
	// ttlMs; HintCacheSize is how many tools' annotations are kept at
	// most, the least recently listed evicted first.
	HintTTL       time.Duration
	HintCacheSize int
	// AdvertiseIdempotent sets idempotentHint: true, in the tools/list
	// answers the server reads, on every tool the policy protects
	// (ProtectsTool; toolhints.Advertise).
	AdvertiseIdempotent bool
	// Hints are the tools' annotations, and the x-mcp-header mark on the
	// key parameter (KeyParam), as this server learned them from the
	// upstreams' tools/list results, for ToolsUnlessHinted and
	// KeyFromMCPParam; nil otherwise. Each server learns on its own.
	Hints *toolhints.Cache
}

// PrepareTools gives a ToolsUnlessHinted or KeyFromMCPParam policy its
// own, empty cache of what tools/list says (ToolRules.Hints), sized as its
// rules say.
func (p *Policy) PrepareTools() {
	p.Tools.Hints = nil
	if p.Tools.Protect == ToolsUnlessHinted || p.KeyFrom(KeyFromMCPParam) {
		p.Tools.Hints = toolhints.New(p.Tools.HintCacheSize, p.Tools.HintTTL, p.KeyParamPath())
	}
}

// LearnsTools reports whether the policy learns from tools/list results.
func (p *Policy) LearnsTools() bool { return p.Tools.Hints != nil }

// hinted reports whether the policy protects tools by their annotations
// and has learned them.
func (p *Policy) hinted() bool { return p.Tools.Protect == ToolsUnlessHinted && p.LearnsTools() }

var toolNamePointer = mustPointer("/params/name")

// ToolHinted reports whether body, a tools/call the policy's body
// criteria took, calls a tool whose annotations, as upstream last listed
// them and still fresh at now, say a repeated call is harmless: under
// ToolsUnlessHinted the policy does not protect it. False for every other
// policy, and for a tool whose name is not a string.
func (p *Policy) ToolHinted(upstream string, body []byte, now time.Time) bool {
	if !p.hinted() {
		return false
	}
	name, ok := bodyString(body, toolNamePointer)
	if !ok {
		return false
	}
	h, ok := p.Tools.Hints.Lookup(upstream, name, now)
	return ok && h.Harmless()
}

// IsToolsList reports whether body is a tools/list request with an id:
// its response lists the tools.
func IsToolsList(body []byte) bool {
	vs, err := FindInBody(body, idPointer, methodPointer)
	if err != nil {
		return false
	}
	if k := vs[0].Kind; k != jsonpointer.KindString && k != jsonpointer.KindNumber {
		return false
	}
	return vs[1].Kind == jsonpointer.KindString && vs[1].OneOf("tools/list")
}

// ToolsUpstream names the upstream a request goes to, for the tools'
// annotations: its authority and path, query left out. Annotations
// learned from one upstream's list never decide a call to another.
func ToolsUpstream(authority, path string) string {
	for i := 0; i < len(path); i++ {
		if path[i] == '?' {
			path = path[:i]
			break
		}
	}
	return authority + " " + path
}

// ProtectsTool reports whether every call of the tool named name, to
// upstream, is one the policy protects at now: its body criteria on
// /method and /params/name (if any) take it whatever its arguments, and
// under ToolsUnlessHinted its annotations do not say a repeat is harmless.
// A policy with criteria on other members protects a call by what its
// arguments say, so no tool is protected whatever they are: false.
func (p *Policy) ProtectsTool(upstream, name string, now time.Time) bool {
	for _, c := range p.Match.JSON {
		switch c.Pointer.String() {
		case "/method":
			if !slices.Contains(c.OneOf, "tools/call") {
				return false
			}
		case "/params/name":
			if !slices.Contains(c.OneOf, name) {
				return false
			}
		default:
			return false
		}
	}
	if p.hinted() {
		if h, ok := p.Tools.Hints.Lookup(upstream, name, now); ok && h.Harmless() {
			return false
		}
	}
	return true
}

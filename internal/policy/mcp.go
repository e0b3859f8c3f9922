package policy

import (
	"encoding/base64"
	"slices"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
)

// MCP 2026-07-28 mirrors a request's method and name in headers "so that
// intermediaries can route and inspect requests without parsing the body"
// (modelcontextprotocol, docs/specification/2026-07-28/basic/transports/
// streamable-http.mdx, "Request Metadata" and "Standard Request Headers").
// A server that processes the body must reject a request whose headers do
// not match it with 400 and HeaderMismatch (-32020, "Server Validation");
// only requests of that revision or later are validated so, and an
// intermediary that acts on the headers "SHOULD verify that the
// MCP-Protocol-Version header indicates a version that requires
// header–body validation" (same section). Header names are
// case-insensitive; values are case-sensitive ("Case Sensitivity").
const (
	MCPVersionHeader = "mcp-protocol-version"
	MCPMethodHeader  = "mcp-method"
	MCPNameHeader    = "mcp-name"
	// MCPValidatedFrom is the first revision whose servers validate the
	// headers against the body. Revisions are dates (YYYY-MM-DD) and
	// compare as strings.
	MCPValidatedFrom = "2026-07-28"
)

// MCPHeaders are the MCP headers of one request as sent.
type MCPHeaders struct {
	Version, Method, Name string
	HasMethod, HasName    bool
	// Params are its Mcp-Param-{Name} headers, names in lower case as
	// Envoy sends them, for a policy whose key is a tool parameter
	// (MCPParamMismatch); Envoy's header limits bound them.
	Params []idem.Header
}

// MCPParamPrefix starts the name of every header a 2026-07-28 client
// mirrors a marked tool parameter in, in lower case ("Mcp-Param-{Name}").
const MCPParamPrefix = "mcp-param-"

// Validated reports whether the request claims a revision whose servers
// check these headers against the body.
func (h MCPHeaders) Validated() bool {
	return len(h.Version) == len(MCPValidatedFrom) && h.Version >= MCPValidatedFrom
}

// MCPHeadersMode says what a JSON-RPC policy makes of the MCP headers
// (mcp_headers).
type MCPHeadersMode uint8

const (
	// MCPHeadersCheck: every request is decided at its body, and a
	// request of a validated revision whose headers do not match its body
	// is answered HeaderMismatch, as a server would, before any effect.
	MCPHeadersCheck MCPHeadersMode = iota
	// MCPHeadersTrust: the operator states that the upstream rejects a
	// request whose headers do not match its body (a compliant MCP
	// 2026-07-28 server): a request of a validated revision whose headers
	// name a method or tool no body criterion of the policy takes is
	// passed at its headers, its body never buffered. Everything else is
	// still decided at its body, and checked as under MCPHeadersCheck.
	MCPHeadersTrust
)

// nameMember is the member Mcp-Name mirrors, by method ("Standard Request
// Headers": params.name for tools/call and prompts/get, params.uri for
// resources/read).
func nameMember(method string) string {
	switch method {
	case "tools/call", "prompts/get":
		return "/params/name"
	case "resources/read":
		return "/params/uri"
	}
	return ""
}

// DecodeMCPValue decodes a header value written as "=?base64?…?=" (Value
// Encoding: servers "MUST decode an encoded Mcp-Name or Mcp-Param-{Name}
// value before comparing"); any other value is itself.
func DecodeMCPValue(v string) (string, bool) {
	inner, ok := strings.CutPrefix(v, "=?base64?")
	if !ok {
		return v, true
	}
	inner, ok = strings.CutSuffix(inner, "?=")
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(inner)
	return string(b), err == nil
}

// RuledOutByMCPHeaders reports whether, under MCPHeadersTrust, h says the
// request is one no body criterion of p can take: its method (/method) or
// the name it mirrors (/params/name, /params/uri) is not among the values
// a criterion on that member accepts. It is false whenever the headers do
// not settle it: another revision, a header missing, an encoded name that
// does not decode, criteria on other members only.
func (p *Policy) RuledOutByMCPHeaders(h MCPHeaders) bool {
	if p.MCPHeaders != MCPHeadersTrust || !h.Validated() || !h.HasMethod {
		return false
	}
	if h.Method == "tools/list" && p.LearnsTools() {
		return false // its answer is read for the tools' annotations
	}
	name := ""
	member := nameMember(h.Method)
	if member != "" {
		if !h.HasName {
			return false
		}
		var ok bool
		if name, ok = DecodeMCPValue(h.Name); !ok {
			return false
		}
	}
	for _, c := range p.Match.JSON {
		switch c.Pointer.String() {
		case "/method":
			if !slices.Contains(c.OneOf, h.Method) {
				return true
			}
		case member:
			if member != "" && !slices.Contains(c.OneOf, name) {
				return true
			}
		}
	}
	return false
}

var namePtrs = map[string]jsonpointer.Pointer{"/params/name": mustPointer("/params/name"), "/params/uri": mustPointer("/params/uri")}

// MCPHeaderMismatch reports whether h, the headers of a request of a
// validated revision, say another method or name than its body does
// ("Server Validation": the headers "MUST" match). A header left out is
// no mismatch here: the upstream answers that itself.
func MCPHeaderMismatch(h MCPHeaders, body []byte) bool {
	if !h.Validated() || !h.HasMethod {
		return false
	}
	method, ok := bodyString(body, methodPointer)
	if !ok {
		return false
	}
	if method != h.Method {
		return true
	}
	member := nameMember(method)
	if member == "" || !h.HasName {
		return false
	}
	name, ok := DecodeMCPValue(h.Name)
	if !ok {
		return true
	}
	vs, err := FindInBody(body, namePtrs[member])
	if err != nil || vs[0].Kind != jsonpointer.KindString {
		return vs != nil && vs[0].Found() // a name that is no string cannot match
	}
	got, err := vs[0].Text()
	return err == nil && got != name
}

// MCPParamMismatch says why a tools/call's Mcp-Param header for the
// policy's key parameter (KeyParam) disagrees with its body, or "" when
// it does not. Which header mirrors the parameter is the tool's to say:
// the x-mcp-header mark on it in the input schema upstream last listed
// (toolhints.Mark), not the parameter's name (modelcontextprotocol,
// docs/specification/2026-07-28/basic/transports/streamable-http.mdx,
// "Custom Headers from Tool Parameters"). With a mark known, "Server
// Behavior for Custom Headers" has a server that processes the body
// reject, 400 with HeaderMismatch: a header whose value, decoded, is not
// the body's, or that holds characters "Value Encoding" does not allow;
// and a header left out while the body has the value ("Client omits
// header but value is in body | Non-conforming client | Server MUST
// reject the request"), which only clients of that revision or later
// must send, so only for them (h.Validated). A header for a parameter the
// body lacks, or has as null, disagrees too: the client "MUST omit" it.
// A tool not listed, or whose schema marks no such parameter, has no
// header to check: the key is then the body's value all the same.
func (p *Policy) MCPParamMismatch(h MCPHeaders, upstream string, body []byte, now time.Time) string {
	if !p.KeyFrom(KeyFromMCPParam) || !p.LearnsTools() {
		return ""
	}
	vs, err := FindInBody(body, toolNamePointer, p.KeyParam, methodPointer)
	if err != nil || !vs[2].OneOf("tools/call") {
		return "" // no tool call, or one refused as unreadable elsewhere
	}
	tool, err := vs[0].Text()
	if err != nil {
		return ""
	}
	hints, ok := p.Tools.Hints.Lookup(upstream, tool, now)
	if !ok || hints.Header == "" {
		return ""
	}
	name := MCPParamPrefix + strings.ToLower(hints.Header)
	var sent []string
	for _, hd := range h.Params {
		if hd.Name == name {
			sent = append(sent, hd.Value)
		}
	}
	arg := vs[1]
	present := arg.Found() && arg.Kind != jsonpointer.KindNull
	switch {
	case len(sent) == 0 && present && h.Validated():
		return "no Mcp-Param-" + hints.Header + " header, though tool " + tool + " marks " + p.KeyParam.String() + " with x-mcp-header and the body has it"
	case len(sent) == 0:
		return ""
	case len(sent) > 1:
		return "Mcp-Param-" + hints.Header + " sent twice"
	case !present:
		return "an Mcp-Param-" + hints.Header + " header, though the body has no value at " + p.KeyParam.String()
	}
	v, ok := DecodeMCPValue(sent[0])
	// Integers and booleans as written, not numerically as the "Server
	// Validation" note advises: a key is a string.
	want := string(arg.Raw)
	if arg.Kind == jsonpointer.KindString {
		want, _ = arg.Text()
	}
	if !ok || !headerSafe(sent[0]) || v != want {
		return "the Mcp-Param-" + hints.Header + " header does not match the body's " + p.KeyParam.String()
	}
	return ""
}

// headerSafe reports whether v holds only what "Value Encoding" allows in
// a header value: visible ASCII (0x21-0x7E), space and horizontal tab.
func headerSafe(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c != '\t' && (c < 0x20 || c > 0x7e) {
			return false
		}
	}
	return true
}

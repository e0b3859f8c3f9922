package toolhints

import "encoding/json"

// maxHeaderName bounds the x-mcp-header value the cache keeps per tool:
// the specification sets no length, and a mark longer than any header
// Envoy would pass is no header a client can send.
const maxHeaderName = 256

// Mark returns the x-mcp-header value a tool's inputSchema puts on the
// property at path (property names from the schema's root), or "" when
// it puts none a client mirrors. MCP 2026-07-28 (modelcontextprotocol,
// docs/specification/2026-07-28/basic/transports/streamable-http.mdx,
// "Custom Headers from Tool Parameters", "Schema Extension"): the mark is
// a member of the property's own schema; the property must be reached
// "via a chain consisting solely of `properties` keys", so a nested
// property counts and one behind items, oneOf, $ref and the like does
// not; the value is not empty and is an RFC 9110 token (1*tchar). A mark
// that breaks these makes the tool invalid, and clients leave the tool
// out of their lists. Member names are compared exactly, as JSON Schema
// does (encoding/json's struct fields would match any case).
func Mark(inputSchema []byte, path []string) string {
	node := inputSchema
	for _, name := range path {
		var props map[string]json.RawMessage
		if json.Unmarshal(member(node, "properties"), &props) != nil {
			return ""
		}
		if node = props[name]; node == nil {
			return ""
		}
	}
	var h string
	if json.Unmarshal(member(node, "x-mcp-header"), &h) != nil || h == "" || len(h) > maxHeaderName {
		return ""
	}
	for i := 0; i < len(h); i++ {
		if !isTChar(h[i]) {
			return ""
		}
	}
	return h
}

// member is the member name of the JSON object obj, or nil.
func member(obj []byte, name string) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(obj, &m) != nil {
		return nil
	}
	return m[name]
}

// isTChar reports whether c is an RFC 9110 tchar (section 5.6.2).
func isTChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}

package jsonrpc

import (
	"bytes"
	"encoding/json"
)

// FinalResponse returns the JSON-RPC response to the request whose id is
// id carried in a stored text/event-stream body, the way MCP's Streamable
// HTTP transport may answer a POST: the MCP specification (2025-06-18,
// Basic, Transports, "Sending Messages to the Server") lets the server
// send JSON-RPC requests and notifications (progress, logging) on the
// stream before "the JSON-RPC response for the JSON-RPC request sent in
// the POST body", after which it SHOULD close the stream. Only that
// response is replayed; the notifications and requests before it are
// not. A nil id takes the last response in the stream.
//
// The stream is read as the WHATWG HTML Standard's server-sent events
// sections say ("Parsing an event stream", 9.2.5, and "Interpreting an
// event stream", 9.2.6): one leading U+FEFF is ignored; lines end in CRLF,
// LF or CR; a line
// starting with ":" is a comment; a field's value follows the first ":"
// less one leading space; "data" lines join with LF; an empty line
// dispatches the event, and an event not ended by an empty line before
// the end of the stream is not dispatched. Events whose type ("event"
// field) is neither empty nor "message" are not JSON-RPC messages and are
// skipped (MCP servers send the default type; the Go SDK writes no event
// field, or "message", in mcp/event.go writeEvent).
func FinalResponse(stream []byte, id json.RawMessage) ([]byte, error) {
	var found []byte
	for data := range events(stream) {
		v, ok := isResponse(data)
		if !ok {
			continue
		}
		if id == nil || sameID(v, id) {
			found = data
		}
	}
	if found == nil {
		return nil, ErrNotResponse
	}
	return found, nil
}

// events yields the data of each dispatched event of the default or
// "message" type.
func events(stream []byte) func(yield func([]byte) bool) {
	return func(yield func([]byte) bool) {
		stream := bytes.TrimPrefix(stream, []byte("\uFEFF"))
		var data []byte
		hasData, typ := false, ""
		for len(stream) > 0 {
			var line []byte
			i := bytes.IndexAny(stream, "\r\n")
			if i < 0 {
				return // the last line is not ended: its event is not dispatched
			}
			line = stream[:i]
			if stream[i] == '\r' && i+1 < len(stream) && stream[i+1] == '\n' {
				stream = stream[i+2:]
			} else {
				stream = stream[i+1:]
			}
			if len(line) == 0 {
				if hasData && (typ == "" || typ == "message") {
					if !yield(bytes.TrimSuffix(data, []byte("\n"))) {
						return
					}
				}
				data, hasData, typ = nil, false, ""
				continue
			}
			if line[0] == ':' {
				continue
			}
			name, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(name) {
			case "data":
				data = append(append(data, value...), '\n')
				hasData = true
			case "event":
				typ = string(value)
			}
		}
	}
}

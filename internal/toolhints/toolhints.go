// Package toolhints keeps what an MCP server last said of its tools'
// behaviour: the readOnlyHint and idempotentHint annotations of the tools
// its tools/list results named, and the x-mcp-header that marks one chosen
// parameter of their input schemas, per upstream, in a bounded in-memory
// cache. A tool the cache does not hold (never listed, expired, evicted)
// is one nothing is known of.
//
// Annotations are hints: "all properties in ToolAnnotations are hints.
// They are not guaranteed to provide a faithful description of tool
// behavior", and "clients MUST consider tool annotations to be untrusted
// unless they come from trusted servers" (modelcontextprotocol,
// schema/2026-07-28/schema.ts ToolAnnotations; docs/specification/
// 2026-07-28/server/tools.mdx, "Tool"). The cache records them as said;
// what they are trusted for is the policy's to say (policy.ToolRules).
package toolhints

import (
	"bufio"
	"bytes"
	"container/list"
	"encoding/json"
	"sync"
	"time"
)

// Hints are the annotations of one tool that say a repeated call is
// harmless. Absent, each is false: "readOnlyHint … Default: false",
// "idempotentHint … Default: false" (schema.ts ToolAnnotations).
type Hints struct {
	ReadOnly, Idempotent bool
	// Header is the x-mcp-header the tool's inputSchema puts on the
	// cache's parameter (New), "" when it marks none: a 2026-07-28 client
	// mirrors that parameter's value in the Mcp-Param-{Header} header.
	Header string
}

// Harmless reports whether the tool says a repeated call has no further
// effect: it modifies nothing, or "calling the tool repeatedly with the
// same arguments will have no additional effect on its environment"
// (schema.ts, idempotentHint).
func (h Hints) Harmless() bool { return h.ReadOnly || h.Idempotent }

// Cache holds the hints of at most Max tools, across upstreams; adding
// one more evicts the least recently learned. Safe for concurrent use.
type Cache struct {
	max        int
	defaultTTL time.Duration
	param      []string

	mu      sync.Mutex
	entries map[entryKey]*list.Element
	order   *list.List // of *entry, least recently learned first
}

type entryKey struct{ upstream, tool string }

type entry struct {
	key     entryKey
	hints   Hints
	expires time.Time
}

// New returns a cache of at most max tools whose hints are kept for
// defaultTTL when the list that named them gives no ttlMs. param, when
// not empty, is the path of property names under the tool's arguments
// whose x-mcp-header mark each tool's Hints.Header records (Mark).
func New(max int, defaultTTL time.Duration, param []string) *Cache {
	return &Cache{max: max, defaultTTL: defaultTTL, param: param, entries: map[entryKey]*list.Element{}, order: list.New()}
}

// Max is the number of tools the cache holds at most.
func (c *Cache) Max() int { return c.max }

// DefaultTTL is how long hints are kept when the list gives no ttlMs.
func (c *Cache) DefaultTTL() time.Duration { return c.defaultTTL }

// Len is the number of tools held, expired ones included until evicted.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// Lookup returns the hints upstream last listed for tool, if they are
// held and fresh at now.
func (c *Cache) Lookup(upstream, tool string, now time.Time) (Hints, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[entryKey{upstream, tool}]
	if !ok {
		return Hints{}, false
	}
	e := el.Value.(*entry)
	if !now.Before(e.expires) {
		c.order.Remove(el)
		delete(c.entries, e.key)
		return Hints{}, false
	}
	return e.hints, true
}

// Tool is one tool of a tools/list result.
type Tool struct {
	Name  string
	Hints Hints
	// inputSchema is the tool's inputSchema as listed, read by Learn for
	// the cache's parameter and not kept.
	inputSchema json.RawMessage
}

// Learn records the tools of a tools/list result of upstream, read at
// now, for the result's ttlMs ("ttlMs", modelcontextprotocol
// docs/specification/2026-07-28/server/tools.mdx, "Listing Tools", and
// caching.mdx) or else the cache's default. A list is one page of the
// server's tools (nextCursor): tools of other pages are left as they are.
// It returns how many tools it learned.
func (c *Cache) Learn(upstream string, tools []Tool, ttl time.Duration, now time.Time) int {
	if ttl <= 0 {
		return 0 // immediately stale: nothing to keep
	}
	expires := now.Add(ttl)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tools {
		if len(c.param) > 0 {
			t.Hints.Header = Mark(t.inputSchema, c.param)
		}
		k := entryKey{upstream, t.Name}
		if el, ok := c.entries[k]; ok {
			e := el.Value.(*entry)
			e.hints, e.expires = t.Hints, expires
			c.order.MoveToBack(el)
			continue
		}
		if c.max <= 0 {
			return 0
		}
		for c.order.Len() >= c.max {
			old := c.order.Front()
			c.order.Remove(old)
			delete(c.entries, old.Value.(*entry).key)
		}
		c.entries[k] = c.order.PushBack(&entry{key: k, hints: t.Hints, expires: expires})
	}
	return len(tools)
}

// Listing is what a tools/list response says: its tools and, when it
// gave one, its ttlMs.
type Listing struct {
	Tools  []Tool
	TTL    time.Duration
	HasTTL bool
}

// listResult is the part of a tools/list response read here
// (schema.ts ListToolsResult, Tool.annotations, ToolAnnotations). A hint
// that is not a boolean reads as absent: false.
type listResult struct {
	Result *struct {
		Tools []struct {
			Name        *string         `json:"name"`
			InputSchema json.RawMessage `json:"inputSchema"`
			Annotations struct {
				ReadOnly   any `json:"readOnlyHint"`
				Idempotent any `json:"idempotentHint"`
			} `json:"annotations"`
		} `json:"tools"`
		TTLMs *float64 `json:"ttlMs"`
	} `json:"result"`
}

// ParseResponse reads a tools/list response body: a JSON-RPC response
// (application/json), or a text/event-stream whose events carry JSON-RPC
// messages in their data ("Streamable HTTP": the server "MUST either
// return Content-Type: text/event-stream … or Content-Type:
// application/json"), of which the one with a result holding tools is
// the answer. ok is false when the body holds no such result: an error,
// a body that is no JSON-RPC response, a stream cut short.
func ParseResponse(body []byte, eventStream bool) (Listing, bool) {
	if !eventStream {
		return parseMessage(body)
	}
	var out Listing
	found := false
	for _, data := range events(body) {
		if l, ok := parseMessage(data); ok {
			out, found = l, true
		}
	}
	return out, found
}

func parseMessage(msg []byte) (Listing, bool) {
	var r listResult
	if json.Unmarshal(msg, &r) != nil || r.Result == nil || r.Result.Tools == nil {
		return Listing{}, false
	}
	var out Listing
	for _, t := range r.Result.Tools {
		if t.Name == nil {
			continue
		}
		ro, _ := t.Annotations.ReadOnly.(bool)
		id, _ := t.Annotations.Idempotent.(bool)
		out.Tools = append(out.Tools, Tool{Name: *t.Name, Hints: Hints{ReadOnly: ro, Idempotent: id}, inputSchema: t.InputSchema})
	}
	if ms := r.Result.TTLMs; ms != nil && *ms >= 0 && *ms < float64(1<<62)/float64(time.Millisecond) {
		out.TTL, out.HasTTL = time.Duration(*ms*float64(time.Millisecond)), true
	}
	return out, true
}

// events returns the data of each complete event of a text/event-stream
// (WHATWG HTML, "Server-sent events", "Interpreting an event stream":
// lines end in CRLF, LF or CR; "data" fields are joined with LF; an event
// is dispatched at a blank line). An event the stream does not finish is
// left out.
func events(body []byte) [][]byte {
	var out [][]byte
	var data []byte
	has := false
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, len(body)+1)
	sc.Split(scanLines)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if has {
				out = append(out, data)
			}
			data, has = nil, false
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if !bytes.Equal(field, []byte("data")) {
			continue
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		if has {
			data = append(data, '\n')
		}
		data, has = append(data, value...), true
	}
	return out
}

// scanLines splits at CRLF, LF or CR; a final line without its end is
// not returned (its event is unfinished).
func scanLines(data []byte, atEOF bool) (int, []byte, error) {
	for i, b := range data {
		switch b {
		case '\n':
			return i + 1, data[:i], nil
		case '\r':
			if i+1 < len(data) {
				if data[i+1] == '\n' {
					return i + 2, data[:i], nil
				}
				return i + 1, data[:i], nil
			}
			if atEOF {
				return i + 1, data[:i], nil
			}
			return 0, nil, nil // a CRLF may be split
		}
	}
	if atEOF {
		return len(data), nil, bufio.ErrFinalToken
	}
	return 0, nil, nil
}

package toolhints

import (
	"testing"
	"time"
)

// TestMark reads the x-mcp-header of a property, top-level or nested, by
// the chain of properties keys that reaches it (streamable-http.mdx,
// "Schema Extension"), and finds none where the specification says a
// client mirrors none: behind items, oneOf or $ref, an empty or
// non-token value, a value that is no string, member names in another
// case.
func TestMark(t *testing.T) {
	// The specification's example tool definition ("Schema Extension").
	sql := `{"type":"object","properties":{"region":{"type":"string","description":"The region to execute the query in","x-mcp-header":"Region"},` +
		`"query":{"type":"string","description":"The SQL query to execute"}},"required":["region","query"]}`
	nested := `{"type":"object","properties":{"payment":{"type":"object","properties":{"key":{"type":"string","x-mcp-header":"Idempotency-Key"}}}}}`
	for _, c := range []struct {
		schema string
		path   []string
		want   string
	}{
		{sql, []string{"region"}, "Region"},
		{sql, []string{"query"}, ""},
		{sql, []string{"absent"}, ""},
		{nested, []string{"payment", "key"}, "Idempotency-Key"},
		{nested, []string{"payment"}, ""},
		{nested, []string{"key"}, ""},
		{`{"properties":{"a":{"type":"array","items":{"properties":{"k":{"x-mcp-header":"K"}}}}}}`, []string{"a", "k"}, ""},
		{`{"properties":{"a":{"oneOf":[{"properties":{"k":{"x-mcp-header":"K"}}}]}}}`, []string{"a", "k"}, ""},
		{`{"properties":{"a":{"$ref":"#/$defs/k"}},"$defs":{"k":{"x-mcp-header":"K"}}}`, []string{"a"}, ""},
		{`{"properties":{"a":{"x-mcp-header":""}}}`, []string{"a"}, ""},
		{`{"properties":{"a":{"x-mcp-header":"Bad Name"}}}`, []string{"a"}, ""},
		{`{"properties":{"a":{"x-mcp-header":"K\r\nX"}}}`, []string{"a"}, ""},
		{`{"properties":{"a":{"x-mcp-header":7}}}`, []string{"a"}, ""},
		{`{"Properties":{"a":{"x-mcp-header":"K"}}}`, []string{"a"}, ""},
		{`{"properties":{"a":{"X-MCP-HEADER":"K"}}}`, []string{"a"}, ""},
		{`{"properties":[1]}`, []string{"a"}, ""},
		{`not json`, []string{"a"}, ""},
		{``, []string{"a"}, ""},
	} {
		if got := Mark([]byte(c.schema), c.path); got != c.want {
			t.Errorf("Mark(%s, %v) = %q, want %q", c.schema, c.path, got, c.want)
		}
	}
	long := make([]byte, maxHeaderName+1)
	for i := range long {
		long[i] = 'a'
	}
	if got := Mark([]byte(`{"properties":{"a":{"x-mcp-header":"`+string(long)+`"}}}`), []string{"a"}); got != "" {
		t.Errorf("a mark of %d bytes was kept", len(long))
	}
}

// TestLearnMark: a cache made for a parameter keeps, per tool, the mark a
// listed tools/list answer's inputSchema puts on it; a later list that
// drops the mark drops it; a cache made for none keeps none.
func TestLearnMark(t *testing.T) {
	now := time.Unix(1000, 0)
	list := func(mark string) []Tool {
		l, ok := ParseResponse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"pay","inputSchema":`+
			`{"type":"object","properties":{"payment":{"type":"object","properties":{"key":{"type":"string"`+mark+`}}}}}}]}}`), false)
		if !ok {
			t.Fatal("the list was not read")
		}
		return l.Tools
	}
	c := New(4, time.Minute, []string{"payment", "key"})
	c.Learn("u", list(`,"x-mcp-header":"Idempotency-Key"`), time.Minute, now)
	if h, ok := c.Lookup("u", "pay", now); !ok || h.Header != "Idempotency-Key" {
		t.Fatalf("pay: %+v %v", h, ok)
	}
	c.Learn("u", list(``), time.Minute, now)
	if h, _ := c.Lookup("u", "pay", now); h.Header != "" {
		t.Fatalf("a dropped mark is kept: %+v", h)
	}
	plain := New(4, time.Minute, nil)
	plain.Learn("u", list(`,"x-mcp-header":"Idempotency-Key"`), time.Minute, now)
	if h, _ := plain.Lookup("u", "pay", now); h.Header != "" {
		t.Fatalf("a cache for no parameter kept %+v", h)
	}
}

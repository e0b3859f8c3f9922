package toolhints

import (
	"testing"
	"time"
)

// TestParseResponse reads a tools/list answer as JSON and as an event
// stream (LF, CRLF and CR line ends, a notification before the answer),
// with hints of every spelling; an error answer or a cut stream lists
// nothing.
func TestParseResponse(t *testing.T) {
	answer := `{"jsonrpc":"2.0","id":1,"result":{"ttlMs":1500,"tools":[` +
		`{"name":"r","annotations":{"readOnlyHint":true}},` +
		`{"name":"i","annotations":{"idempotentHint":true,"readOnlyHint":false}},` +
		`{"name":"s","annotations":{"readOnlyHint":"true"}},` +
		`{"name":"n"},{"annotations":{"readOnlyHint":true}}]}}`
	want := []Tool{{Name: "r", Hints: Hints{ReadOnly: true}}, {Name: "i", Hints: Hints{Idempotent: true}}, {Name: "s", Hints: Hints{}}, {Name: "n", Hints: Hints{}}}
	note := `{"jsonrpc":"2.0","method":"notifications/progress","params":{}}`
	for name, c := range map[string]struct {
		body string
		sse  bool
	}{
		"json":     {answer, false},
		"sse lf":   {"event: message\ndata: " + note + "\n\nevent: message\ndata: " + answer + "\n\n", true},
		"sse crlf": {"id: 1\r\ndata:" + answer + "\r\n\r\n", true},
		"sse cr":   {": comment\rdata: " + answer + "\r\r", true},
	} {
		l, ok := ParseResponse([]byte(c.body), c.sse)
		if !ok || !l.HasTTL || l.TTL != 1500*time.Millisecond || len(l.Tools) != len(want) {
			t.Fatalf("%s: %v %+v", name, ok, l)
		}
		for i := range want {
			if l.Tools[i].Name != want[i].Name || l.Tools[i].Hints != want[i].Hints {
				t.Errorf("%s: tool %d is %+v, want %+v", name, i, l.Tools[i], want[i])
			}
		}
	}
	for name, c := range map[string]struct {
		body string
		sse  bool
	}{
		"error":       {`{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}`, false},
		"not json":    {`tools`, false},
		"unfinished":  {"data: " + answer, true},
		"no tools":    {`{"jsonrpc":"2.0","id":1,"result":{}}`, false},
		"json as sse": {answer, true},
	} {
		if l, ok := ParseResponse([]byte(c.body), c.sse); ok {
			t.Errorf("%s: listed %+v", name, l)
		}
	}
}

// TestCacheBoundAndExpiry: the cache holds at most its size, forgetting
// the least recently learned; an entry lives for its ttl; a list seen
// again refreshes its tools; upstreams do not share entries.
func TestCacheBoundAndExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	c := New(2, time.Minute, nil)
	c.Learn("u", []Tool{{Name: "a", Hints: Hints{ReadOnly: true}}, {Name: "b", Hints: Hints{Idempotent: true}}}, time.Minute, now)
	if _, ok := c.Lookup("v", "a", now); ok {
		t.Fatal("another upstream's entry was found")
	}
	c.Learn("u", []Tool{{Name: "a", Hints: Hints{ReadOnly: true}}}, time.Minute, now) // a is now the most recent
	c.Learn("u", []Tool{{Name: "c", Hints: Hints{}}}, time.Minute, now)
	if _, ok := c.Lookup("u", "b", now); ok || c.Len() != 2 {
		t.Fatalf("b was kept past the bound: len %d", c.Len())
	}
	if h, ok := c.Lookup("u", "a", now.Add(59*time.Second)); !ok || !h.Harmless() {
		t.Fatalf("a: %+v %v", h, ok)
	}
	if _, ok := c.Lookup("u", "a", now.Add(time.Minute)); ok {
		t.Fatal("a outlived its ttl")
	}
	if n := c.Learn("u", []Tool{{Name: "d", Hints: Hints{}}}, 0, now); n != 0 {
		t.Fatal("a list with ttl 0 was learned")
	}
}

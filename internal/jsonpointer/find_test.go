package jsonpointer

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/jsonscan"
)

func mustParse(t testing.TB, s string) Pointer {
	t.Helper()
	p, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const toolCall = `{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"create_order","arguments":{"client_order_id":"o-42","qty":3,"tags":["a","b"]},"_meta":{"progressToken":7}}}`

func TestFind(t *testing.T) {
	for _, tc := range []struct {
		body, ptr string
		kind      Kind
		raw       string
	}{
		{toolCall, "/method", KindString, `"tools/call"`},
		{toolCall, "/id", KindString, `"c-1"`},
		{toolCall, "/params/arguments/client_order_id", KindString, `"o-42"`},
		{toolCall, "/params/arguments/qty", KindNumber, `3`},
		{toolCall, "/params/arguments/tags/1", KindString, `"b"`},
		{toolCall, "/params/arguments/tags", KindArray, `["a","b"]`},
		{toolCall, "/params/_meta", KindObject, `{"progressToken":7}`},
		{toolCall, "", KindObject, toolCall},
		{toolCall, "/params/arguments/tags/2", KindNone, ``},
		{toolCall, "/params/arguments/tags/-", KindNone, ``},
		{toolCall, "/params/arguments/tags/01", KindNone, ``},
		{toolCall, "/nope", KindNone, ``},
		{toolCall, "/method/x", KindNone, ``},
		{`{"a/b":{"m~n":null}}`, "/a~1b/m~0n", KindNull, `null`},
		{`{"k":true}`, "/k", KindBool, `true`},
		{` { "k" : -1.5e3 } `, "/k", KindNumber, `-1.5e3`},
		{`{"\u006b":"v"}`, "/k", KindString, `"v"`},
		{`{"":1}`, "/", KindNumber, `1`},
	} {
		vs, err := Find([]byte(tc.body), mustParse(t, tc.ptr))
		if err != nil {
			t.Errorf("Find(%q, %q): %v", tc.body, tc.ptr, err)
			continue
		}
		v := vs[0]
		if v.Kind != tc.kind || string(v.Raw) != tc.raw || v.Found() != (tc.kind != KindNone) {
			t.Errorf("Find(%q, %q) = %v %q; want %v %q", tc.body, tc.ptr, v.Kind, v.Raw, tc.kind, tc.raw)
		}
		if v.Found() && tc.body[v.Offset:v.Offset+len(v.Raw)] != tc.raw {
			t.Errorf("Find(%q, %q): offset %d is wrong", tc.body, tc.ptr, v.Offset)
		}
	}
}

func TestFindSeveralInOnePass(t *testing.T) {
	vs, err := Find([]byte(toolCall), mustParse(t, "/method"), mustParse(t, "/params/name"), mustParse(t, "/id"), mustParse(t, "/missing"))
	if err != nil {
		t.Fatal(err)
	}
	if !vs[0].OneOf("tools/call") || !vs[1].OneOf("send_mail", "create_order") || vs[1].OneOf("send_mail") {
		t.Error("OneOf does not match the members")
	}
	if vs[2].OneOf("c-2") || vs[3].OneOf("") || vs[3].Found() {
		t.Error("OneOf matched a different or missing member")
	}
	num, _ := Find([]byte(`{"n":1,"s":"1"}`), mustParse(t, "/n"), mustParse(t, "/s"))
	if num[0].OneOf("1") || !num[1].OneOf("1") {
		t.Error("a number matched as a string, or a string did not")
	}
}

// TestFindErrors pins what a policy's `required` rule will see.
func TestFindErrors(t *testing.T) {
	key := mustParse(t, "/idempotency_key")
	for _, tc := range []struct {
		body   string
		want   error
		offset int // for syntax errors; -1 when none
	}{
		{`not json`, ErrNotJSON, 0},
		{``, ErrNotJSON, 0},
		{`{"idempotency_key":"k"`, ErrNotJSON, 22},
		{`{"idempotency_key":"k"} {}`, ErrNotJSON, 24},
		{`{"idempotency_key":"k","x":[1,]}`, ErrNotJSON, 30},
		{`{"a":01}`, ErrNotJSON, 6},
		{`{"a":"\x"}`, ErrNotJSON, 5},
		{"{\"a\":\"\n\"}", ErrNotJSON, 6},
		{`{"idempotency_key":"k","idempotency_key":"j"}`, ErrDuplicateMember, 23},
		{`{"x":{"a":1,"\u0061":2}}`, ErrDuplicateMember, 12},
		{`[{"idempotency_key":"k"}]`, ErrTopLevelArray, -1},
		{`"k"`, ErrNotObject, -1},
		{`null`, ErrNotObject, -1},
		{strings.Repeat(`{"a":`, 250) + `1` + strings.Repeat(`}`, 250), ErrNotJSON, -1},
	} {
		_, err := String([]byte(tc.body), key)
		if !errors.Is(err, tc.want) {
			t.Errorf("String(%.40q) = %v; want %v", tc.body, err, tc.want)
			continue
		}
		var se *SyntaxError
		if tc.offset >= 0 && (!errors.As(err, &se) || se.Offset != tc.offset) {
			t.Errorf("String(%q) = %v; want the offset %d", tc.body, err, tc.offset)
		}
	}
	for _, tc := range []struct {
		body string
		want error
	}{
		{`{}`, ErrMissing}, {`{"idempotency_key":7}`, ErrNotString}, {`{"idempotency_key":null}`, ErrNotString},
		{`{"idempotency_key":{"v":"k"}}`, ErrNotString},
	} {
		if _, err := String([]byte(tc.body), key); !errors.Is(err, tc.want) {
			t.Errorf("String(%q) = %v; want %v", tc.body, err, tc.want)
		}
	}
	if s, err := String([]byte(`{"idempotency_key":"a\"b\u00e9"}`), key); err != nil || s != "a\"bé" {
		t.Errorf("escaped key = %q, %v", s, err)
	}
}

// TestFindManyMembersDuplicate: duplicates past the set threshold are
// found too.
func TestFindManyMembersDuplicate(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := range 100 {
		b.WriteString(`"m` + strconv.Itoa(i) + `":1,`)
	}
	b.WriteString(`"m50":2}`)
	if _, err := Find([]byte(b.String())); !errors.Is(err, ErrDuplicateMember) {
		t.Fatalf("Find = %v; want ErrDuplicateMember", err)
	}
}

// FuzzFind checks Find against encoding/json: it accepts a body exactly
// when encoding/json finds it valid, unique-named and not too deep, and
// the value it finds is the one encoding/json reaches by the same path.
func FuzzFind(f *testing.F) {
	f.Add([]byte(toolCall), "/params/arguments/tags/0")
	f.Add([]byte(`{"a":[{"b":"\u00e9"}]}`), "/a/0/b")
	f.Add([]byte(`{"a":1,"a":2}`), "/a")
	f.Add([]byte(`[1]`), "/0")
	f.Fuzz(func(t *testing.T, body []byte, ptr string) {
		p, err := Parse(ptr)
		if err != nil {
			return
		}
		vs, err := Find(body, p)
		shallow := bytes.Count(body, []byte("{"))+bytes.Count(body, []byte("[")) < jsonscan.MaxDepth
		switch {
		case errors.Is(err, ErrNotJSON):
			if json.Valid(body) && shallow {
				t.Fatalf("Find(%q) = %v, but encoding/json finds it valid", body, err)
			}
			return
		case errors.Is(err, ErrDuplicateMember):
			return
		case !json.Valid(body):
			t.Fatalf("Find(%q) = %v, but encoding/json finds it invalid", body, err)
		case err != nil:
			var top any
			json.Unmarshal(body, &top)
			if _, obj := top.(map[string]any); obj {
				t.Fatalf("Find(%q) = %v for an object", body, err)
			}
			return
		}
		var doc any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			t.Fatal(err)
		}
		want, ok := doc, true
		for _, tok := range p.Tokens() {
			switch v := want.(type) {
			case map[string]any:
				want, ok = v[tok]
			case []any:
				ok = false
				for i := range v {
					if MatchesIndex(tok, i) {
						want, ok = v[i], true
					}
				}
			default:
				ok = false
			}
			if !ok {
				break
			}
		}
		if vs[0].Found() != ok {
			t.Fatalf("Find(%q, %q) found %v, encoding/json %v", body, ptr, vs[0].Found(), ok)
		}
		if !ok {
			return
		}
		var got any
		d2 := json.NewDecoder(bytes.NewReader(vs[0].Raw))
		d2.UseNumber()
		if err := d2.Decode(&got); err != nil {
			t.Fatalf("Raw %q: %v", vs[0].Raw, err)
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if !bytes.Equal(g, w) {
			t.Fatalf("Find(%q, %q) = %s, encoding/json %s", body, ptr, g, w)
		}
	})
}

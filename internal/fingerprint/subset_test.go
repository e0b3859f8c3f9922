package fingerprint

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
)

func pointers(t *testing.T, texts ...string) []jsonpointer.Pointer {
	t.Helper()
	var out []jsonpointer.Pointer
	for _, s := range texts {
		p, err := jsonpointer.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func TestCanonicalSubset(t *testing.T) {
	const rpc = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send","_meta":{"progressToken":"p1"},"arguments":{"to":"a@b","n":1}}}`
	for _, tc := range []struct {
		name             string
		include, exclude []string
		in, want         string
	}{
		{"exclude id and meta", nil, []string{"/id", "/params/_meta"}, rpc,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"n":1,"to":"a@b"},"name":"send"}}`},
		{"exclude absent member", nil, []string{"/nope", "/params/nope/x"}, `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"exclude array element", nil, []string{"/a/1"}, `{"a":[1,2,3]}`, `{"a":[1,3]}`},
		{"exclude index with leading zero names nothing", nil, []string{"/a/01"}, `{"a":[1,2,3]}`, `{"a":[1,2,3]}`},
		{"exclude escaped names", nil, []string{"/a~1b", "/m~0n"}, `{"a/b":1,"m~n":2,"c":3}`, `{"c":3}`},
		{"exclude whole body", nil, []string{""}, `{"a":1}`, ``},
		{"include", []string{"/params/arguments", "/params/name"}, nil, rpc,
			`{"/params/arguments":{"n":1,"to":"a@b"},"/params/name":"send"}`},
		{"include absent is left out", []string{"/missing", "/method"}, nil, rpc, `{"/method":"tools/call"}`},
		{"include null is kept", []string{"/a"}, nil, `{"a":null}`, `{"/a":null}`},
		{"include and exclude inside", []string{"/params"}, []string{"/params/_meta"}, rpc,
			`{"/params":{"arguments":{"n":1,"to":"a@b"},"name":"send"}}`},
		{"include nested twice", []string{"/p", "/p/q"}, nil, `{"p":{"r":2,"q":1}}`, `{"/p":{"q":1,"r":2},"/p/q":1}`},
		{"include duplicate pointer", []string{"/a", "/a"}, nil, `{"a":1}`, `{"/a":1}`},
		{"include whole body", []string{""}, nil, `{"b":1,"a":2}`, `{"":{"a":2,"b":1}}`},
		{"include array element", []string{"/a/1"}, nil, `{"a":[1,{"y":1,"x":2}]}`, `{"/a/1":{"x":2,"y":1}}`},
		{"exclude wins over include", []string{"/a"}, []string{"/a"}, `{"a":1}`, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := new(canon)
			got, ok := c.run([]byte(tc.in), JSONOptions{Include: pointers(t, tc.include...), Exclude: pointers(t, tc.exclude...)})
			if !ok || string(got) != tc.want {
				t.Fatalf("got %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// TestCanonicalSubsetRefusesWhatTheWholeBodyRefuses: a member left out of
// the subset is still parsed, so a duplicate or a syntax error anywhere
// makes the body raw bytes, as without options.
func TestCanonicalSubsetRefusesWhatTheWholeBodyRefuses(t *testing.T) {
	opts := JSONOptions{Include: pointers(t, "/a"), Exclude: pointers(t, "/b")}
	for _, in := range []string{`{"a":1,"b":{"x":1,"x":2}}`, `{"a":1,"b":[1,]}`, `{"a":1,"c":"\x"}`, `{"a":1} 2`} {
		if got, ok := new(canon).run([]byte(in), opts); ok {
			t.Errorf("%q: got %q, want a refusal", in, got)
		}
	}
}

func TestJSONRPCRetryFingerprint(t *testing.T) {
	opts := JSONOptions{Exclude: pointers(t, "/id", "/params/_meta")}
	fp := func(body string, o JSONOptions) [32]byte {
		return Compute(Request{Method: "POST", Path: "/mcp", Body: []byte(body), JSON: true, JSONOptions: o}, nil)
	}
	first := fp(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send","arguments":{"to":"a@b"},"_meta":{"progressToken":1}}}`, opts)
	retry := fp(`{"jsonrpc":"2.0","id":"r-2","method":"tools/call","params":{"_meta":{"progressToken":9},"arguments":{"to":"a@b"},"name":"send"}}`, opts)
	changed := fp(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send","arguments":{"to":"c@d"},"_meta":{"progressToken":1}}}`, opts)
	if first != retry {
		t.Error("a retry with a new id and progress token fingerprints differently")
	}
	if first == changed {
		t.Error("a changed argument fingerprints the same")
	}
	whole := fp(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send","arguments":{"to":"a@b"}}}`, JSONOptions{})
	if whole == fp(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"send","arguments":{"to":"a@b"}}}`, opts) {
		t.Error("a subset collides with the whole body it equals")
	}
	inc := JSONOptions{Include: pointers(t, "/a")}
	if fp(`{"a":1}`, inc) == fp(`{"a":1}`, JSONOptions{Include: pointers(t, "/b")}) ||
		fp(`{"a":1,"b":1}`, inc) == fp(`{"a":1,"b":1}`, JSONOptions{Exclude: pointers(t, "/b")}) {
		t.Error("different subsets collide")
	}
	if fp(`{"a":1}`, JSONOptions{Include: pointers(t, "/a", "/b")}) != fp(`{"a":1}`, JSONOptions{Include: pointers(t, "/b", "/a", "/a")}) {
		t.Error("the order or repetition of pointers changes the fingerprint")
	}
}

// FuzzCanonicalSubsetMatchesTree checks Exclude and Include against a tree
// built by encoding/json: the member removed from (or the value taken out
// of) the decoded document, marshalled, which for a body canonicalJSON
// accepts is its canonical form (sorted keys, the same string encoding,
// json.Number literals).
func FuzzCanonicalSubsetMatchesTree(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"params":{"_meta":{"p":1},"a":[1,{"b":2}]}}`), "/params/_meta")
	f.Add([]byte(`{"a":[1,{"b":2},3]}`), "/a/1/b")
	f.Add([]byte(`[0,1,2]`), "/1")
	f.Fuzz(func(t *testing.T, body []byte, ptr string) {
		p, err := jsonpointer.Parse(ptr)
		if err != nil {
			return
		}
		if _, ok := referenceCanonicalJSON(body); !ok {
			if _, ok := new(canon).run(body, JSONOptions{Exclude: []jsonpointer.Pointer{p}}); ok {
				t.Fatalf("a subset of %q was accepted where the whole body is refused", body)
			}
			return
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var doc any
		if err := dec.Decode(&doc); err != nil {
			t.Fatal(err)
		}
		// Take out the value at p, remembering whether it was there.
		toks := p.Tokens()
		var taken any
		found := false
		var walk func(v any, i int) any
		walk = func(v any, i int) any {
			if i == len(toks) {
				taken, found = v, true
				return nil
			}
			switch x := v.(type) {
			case map[string]any:
				if c, ok := x[toks[i]]; ok {
					if r := walk(c, i+1); r == nil && found && i+1 == len(toks) {
						delete(x, toks[i])
					} else {
						x[toks[i]] = r
					}
				}
			case []any:
				for j := range x {
					if jsonpointer.MatchesIndex(toks[i], j) {
						if r := walk(x[j], i+1); r == nil && found && i+1 == len(toks) {
							return append(x[:j:j], x[j+1:]...)
						} else {
							x[j] = r
						}
					}
				}
			}
			return v
		}
		rest := walk(doc, 0)
		got, ok := new(canon).run(body, JSONOptions{Exclude: []jsonpointer.Pointer{p}})
		want := []byte{}
		if len(toks) > 0 || !found {
			want, _ = json.Marshal(rest)
		}
		if !ok || !bytes.Equal(got, want) {
			t.Fatalf("Exclude %q of %q = %q, %v; want %q", ptr, body, got, ok, want)
		}
		inc, ok := new(canon).run(body, JSONOptions{Include: []jsonpointer.Pointer{p}})
		wantInc := []byte(`{}`)
		if found {
			v, _ := json.Marshal(taken)
			k, _ := json.Marshal(ptr)
			wantInc = append(append(append(append([]byte(`{`), k...), ':'), v...), '}')
		}
		if !ok || !bytes.Equal(inc, wantInc) {
			t.Fatalf("Include %q of %q = %q, %v; want %q", ptr, body, inc, ok, wantInc)
		}
	})
}

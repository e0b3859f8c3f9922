package fingerprint

import (
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/jsonscan"
)

// nested is an object with value nested depth levels below its top.
func nested(depth int, value string) string {
	return `{"a":` + strings.Repeat("[", depth-1) + value + strings.Repeat("]", depth-1) + `}`
}

// TestReadersAgree: the canonicaliser and the pointer finder, both on
// this scanner, take and refuse the same object bodies, up to the one
// depth limit and no deeper.
func TestReadersAgree(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		ok   bool
	}{
		{"at the depth limit", nested(jsonscan.MaxDepth, "1"), true},
		{"past the depth limit", nested(jsonscan.MaxDepth+1, "1"), false},
		{"escapes", `{"a":"\"\\\/\b\f\n\r\t\u00e9"}`, true},
		{"an escape RFC 8259 does not have", `{"a":"\x"}`, false},
		{"a short unicode escape", `{"a":"\u12"}`, false},
		{"a control character", "{\"a\":\"\x01\"}", false},
		{"numbers", `{"a":[0,-1,1.5,1e9,2E-3,-0.0e+1]}`, true},
		{"a leading zero", `{"a":01}`, false},
		{"a bare dot", `{"a":1.}`, false},
		{"literals", `{"a":[true,false,null]}`, true},
		{"a literal cut short", `{"a":tru}`, false},
		{"a missing colon", `{"a" 1}`, false},
		{"a trailing comma", `{"a":1,}`, false},
		{"trailing data", `{"a":1} x`, false},
		{"a duplicate member", `{"a":1,"a":2}`, false},
		{"an unterminated string", `{"a":"x`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, canonical := canonicalJSON([]byte(tc.body))
			ptr, err := jsonpointer.Parse("/a")
			if err != nil {
				t.Fatal(err)
			}
			_, err = jsonpointer.Find([]byte(tc.body), ptr)
			if canonical != tc.ok || (err == nil) != tc.ok {
				t.Fatalf("canonicaliser %v, pointer finder %v; want both %v", canonical, err, tc.ok)
			}
		})
	}
}

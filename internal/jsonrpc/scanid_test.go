package jsonrpc

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestScanID(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 300) + `1` + strings.Repeat(`}`, 300)
	for _, tc := range []struct {
		name, body, id string
	}{
		{"whole", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}`, `7`},
		{"string id", ` {"id" : "call-\"7\"\u00e9" ,"method":"x"}`, `"call-\"7\"\u00e9"`},
		{"number forms", `{"id":-1.5e3}`, `-1.5e3`},
		{"id after params", `{"method":"x","params":{"id":1,"s":"}{\"]"},"id":"top"}`, `"top"`},
		{"escaped name", `{"\u0069d":9}`, `9`},
		{"deep params", `{"jsonrpc":"2.0","id":3,"params":` + deep + `}`, `3`},
		{"deep params before the id", `{"params":` + deep + `,"id":4}`, `4`},
		{"duplicate inside params", `{"id":5,"params":{"a":1,"a":2}}`, `5`},
		{"invalid UTF-8 elsewhere", "{\"id\":6,\"params\":{\"s\":\"\xff\"}}", `6`},
		{"cut after the id", `{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"arguments":{"text":"xx`, `"a"`},
		{"malformed after the id", `{"id":8,"params":{,,}`, `8`},
		{"trailing garbage", `{"id":8} x`, `8`},

		{"cut before the id", `{"method":"x","params":{"text":"xx`, ``},
		{"cut inside a number id", `{"id":12`, ``},
		{"cut inside a string id", `{"id":"ab`, ``},
		{"two ids", `{"id":1,"method":"x","id":2}`, ``},
		{"two ids, one escaped", `{"id":1,"\u0069d":2}`, ``},
		{"null id", `{"id":null,"method":"x"}`, ``},
		{"object id", `{"id":{"a":1}}`, ``},
		{"bad number", `{"id":01}`, ``},
		{"invalid UTF-8 id", "{\"id\":\"\xff\"}", ``},
		{"no id", `{"jsonrpc":"2.0","method":"notifications/x"}`, ``},
		{"array", `[{"id":1}]`, ``},
		{"not JSON", `id=1`, ``},
		{"empty", ``, ``},
		{"malformed before the id", `{"a" 1,"id":2}`, ``},
		{"nested id only", `{"params":{"id":1}}`, ``},
	} {
		got := ScanID([]byte(tc.body))
		if string(got) != tc.id || (tc.id == "") != (got == nil) {
			t.Errorf("%s: ScanID(%q) = %q, want %q", tc.name, tc.body, got, tc.id)
		}
		// Cut anywhere, the parts read as the whole.
		for i := 0; i <= len(tc.body); i++ {
			if got := ScanID([]byte(tc.body[:i]), []byte(tc.body[i:])); string(got) != tc.id {
				t.Errorf("%s: ScanID in parts cut at %d = %q, want %q", tc.name, i, got, tc.id)
				break
			}
		}
	}
}

// TestScanIDAgreesWithParseRequest: on a body ParseRequest reads, ScanID
// finds the same id.
func TestScanIDAgreesWithParseRequest(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"x":[1,{"id":2}]}}}`,
		`{"params":{"_meta":{"progressToken":"p"}},"method":"m","id":"z"}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	} {
		r, err := ParseRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if got := ScanID([]byte(body)); string(got) != string(r.ID) || (r.ID == nil) != (got == nil) {
			t.Errorf("ScanID(%s) = %s, ParseRequest %s", body, got, r.ID)
		}
	}
}

// FuzzScanID: whatever the bytes, ScanID does not panic, and an id it
// returns is one JSON string or number.
func FuzzScanID(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`), 5)
	f.Add([]byte(`{"params":{"a":[1,"]"]},"id":"x"}`), 0)
	f.Fuzz(func(t *testing.T, body []byte, cut int) {
		if cut < 0 || cut > len(body) {
			cut = len(body) / 2
		}
		got := ScanID(body[:cut], body[cut:])
		if got == nil {
			return
		}
		var v any
		if err := json.Unmarshal(got, &v); err != nil {
			t.Fatalf("ScanID(%q) = %q: %v", body, got, err)
		}
		switch v.(type) {
		case string, float64:
		default:
			t.Fatalf("ScanID(%q) = %q, neither a string nor a number", body, got)
		}
	})
}

package redisstore

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func TestHeadersRoundTrip(t *testing.T) {
	for _, hs := range [][]idem.Header{
		nil,
		{{Name: "content-type", Value: "application/json"}},
		{{Name: "x", Value: ""}, {Name: "x", Value: "2"}, {Name: "bin", Value: "\x00\xff\r\n"}},
	} {
		got, err := decodeHeaders(encodeHeaders(hs))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(hs) {
			t.Fatalf("got %v, want %v", got, hs)
		}
		for i := range hs {
			if got[i] != hs[i] {
				t.Fatalf("header %d = %v, want %v", i, got[i], hs[i])
			}
		}
	}
}

func TestDecodeHeadersRejectsCorruption(t *testing.T) {
	good := encodeHeaders([]idem.Header{{Name: "a", Value: "bc"}})
	for name, b := range map[string][]byte{
		"truncated":        good[:len(good)-1],
		"trailing bytes":   append(append([]byte(nil), good...), 0),
		"huge count":       {0xff, 0xff, 0xff, 0xff, 0x0f},
		"length past end":  {1, 9, 'a'},
		"bad varint":       {0x80},
		"count, no header": {1},
	} {
		if _, err := decodeHeaders(b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: error %v, want errCorrupt", name, err)
		}
	}
}

func TestResponseRoundTrip(t *testing.T) {
	for name, r := range map[string]idem.Response{
		"empty body":   {Status: 204},
		"headers":      {Status: 201, Headers: []idem.Header{{Name: "location", Value: "/o/1"}}, Body: []byte(`{"id":1}`)},
		"body omitted": {Status: 200, BodyOmitted: true},
		"sealed":       {Status: 500, Sealed: true, Body: []byte{0, 1, 2, 0xff}},
	} {
		got, err := decodeResponse(string(testEncodeResponse(&r)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.Status != r.Status || string(got.Body) != string(r.Body) || len(got.Headers) != len(r.Headers) ||
			got.BodyOmitted != r.BodyOmitted || got.Sealed != r.Sealed {
			t.Errorf("%s: got %+v, want %+v", name, got, r)
		}
	}
}

func TestDecodeResponseRejectsCorruption(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":           {},
		"status only":     {200 & 0x7f, 1},
		"no header count": {0xc8, 0x01, 0},
		"status 0":        {0, 0},
		"status 1000":     {0xe8, 0x07, 0},
		"bad headers":     {0xc8, 0x01, 0, 0x80},
		"header past end": {0xc8, 0x01, 0, 1, 9, 'a'},
	} {
		if _, err := decodeResponse(b); !errors.Is(err, errCorrupt) {
			t.Errorf("%s: error %v, want errCorrupt", name, err)
		}
	}
}

// TestParseCompletedLayout pins the completed record's heads to the
// offsets the Lua scripts read (string.sub and struct.unpack are 1-based:
// fingerprint at 2..33, token 34..49; then in the sized and compact
// layouts attempts 50..53 and created 54..59, and in the sized one the
// string's length 60..63; in the decimal one attempts 50..59 and created
// 60..74).
func TestParseCompletedLayout(t *testing.T) {
	var fp idem.Fingerprint
	var tok idem.Token
	for i := range fp {
		fp[i] = byte(i)
	}
	for i := range tok {
		tok[i] = byte(100 + i)
	}
	resp := idem.Response{Status: 201, Body: []byte("ok")}
	enc := string(testEncodeResponse(&resp))
	compact := "d" + string(fp[:]) + string(tok[:]) + "\x00\x00\x01\x07" + "\x01\x8b\xcf\xe5\x68\x7b" + enc
	sized := "e" + compact[1:compactHeadLen] + string(binary.BigEndian.AppendUint32(nil, uint32(sizedHeadLen+len(enc)))) + enc
	decimal := "c" + string(fp[:]) + string(tok[:]) + "0000000263" + "001700000000123" + enc
	if len(sized) != sizedHeadLen+len(enc) || len(compact) != compactHeadLen+len(enc) || len(decimal) != decimalHeadLen+len(enc) {
		t.Fatalf("heads of %d, %d and %d bytes", len(sized)-len(enc), len(compact)-len(enc), len(decimal)-len(enc))
	}
	for _, v := range []string{sized, compact, decimal} {
		rec, err := parseCompleted(v)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateCompleted || rec.Fingerprint != fp || rec.Token != tok || rec.Attempts != 263 ||
			rec.CreatedAt.UnixMilli() != 1700000000123 || rec.Response.Status != 201 || string(rec.Response.Body) != "ok" {
			t.Fatalf("%c: parsed %+v", v[0], rec)
		}
	}
	for name, bad := range map[string]string{
		"sized, short":           sized[:sizedHeadLen-1],
		"sized, cut in the body": sized[:len(sized)-1],
		"sized, grown":           sized + "k",
		"sized, head alone":      sized[:sizedHeadLen],
		"compact, short":         compact[:compactHeadLen-1],
		"compact, bad response":  compact[:compactHeadLen],
		"decimal, short":         decimal[:decimalHeadLen-1],
		"decimal, bad attempts":  decimal[:recordAttemptAt] + "00000000x7" + decimal[decimalCreatedAt:],
		"decimal, bad created":   decimal[:decimalCreatedAt] + "0017000000x0123" + decimal[decimalHeadLen:],
		"decimal, bad response":  decimal[:decimalHeadLen],
		"unknown layout":         "f" + sized[1:],
		"in-flight state letter": "i" + decimal[1:],
	} {
		if _, err := parseCompleted(bad); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// TestCompletedHeadLenByLayout: the response starts where the record's
// own layout puts it, and a string of no layout, or a sized one whose
// length is not the one its head states, has none.
func TestCompletedHeadLenByLayout(t *testing.T) {
	for v, want := range map[string]int{
		"e" + strings.Repeat("\x00", 61) + "\x3f":       63,
		"e" + strings.Repeat("\x00", 61) + "\x40" + "x": 63,
		"e" + strings.Repeat("\x00", 61) + "\x40":       0,
		"e" + strings.Repeat("\x00", 61) + "\x3e" + "x": 0,
		"e" + strings.Repeat("\x00", 60):                0,
		"d" + strings.Repeat("\x00", 58):                59,
		"d" + strings.Repeat("\x00", 80):                59,
		"c" + strings.Repeat("0", 73):                   74,
		"c" + strings.Repeat("0", 60):                   0,
		"d" + strings.Repeat("\x00", 57):                0,
		"x" + strings.Repeat("\x00", 100):               0,
		"":                                              0,
	} {
		if got := completedHeadLen(v); got != want {
			t.Errorf("%q: head of %d bytes, want %d", v, got, want)
		}
	}
}

func testEncodeResponse(r *idem.Response) []byte {
	return append(encodeResponseHead(r), r.Body...)
}

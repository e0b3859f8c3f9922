package extproc

import (
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// TestReplayHeadersAsSetHeaderBuildsThem: the replay's header mutations,
// built in a few allocations by headerSet, are exactly what one setHeader
// per header gives: the marker first, then the first value of a name
// overwrites, later ones append, unsafe and filtered headers are left out.
func TestReplayHeadersAsSetHeaderBuildsThem(t *testing.T) {
	r := &idem.Response{Status: 201, Body: []byte("{}"), Headers: []idem.Header{
		{Name: "content-type", Value: "application/json"},
		{Name: "set-cookie", Value: "a=1"},
		{Name: "x-dup", Value: "1"},
		{Name: "x-bad", Value: "split\r\nx: y"},
		{Name: "x-dup", Value: "2"},
		{Name: "x-denied", Value: "v"},
		{Name: idem.ReplayedHeader, Value: "forged"},
		{Name: "location", Value: "/orders/1"},
		{Name: "x-dup", Value: ""},
	}}
	keep := func(name string) bool { return name != "x-denied" }
	want := []*corev3.HeaderValueOption{
		setHeader(idem.ReplayedHeader, "true", false),
		setHeader("content-type", "application/json", false),
		setHeader("set-cookie", "a=1", false),
		setHeader("x-dup", "1", false),
		setHeader("x-dup", "2", true),
		setHeader("location", "/orders/1", false),
		setHeader("x-dup", "", true),
	}
	resp, dropped := replayResponse(r, keep)
	got := resp.GetImmediateResponse().GetHeaders().GetSetHeaders()
	if len(got) != len(want) || dropped != 1 {
		t.Fatalf("%d mutations (%d dropped), want %d (1 dropped): %v", len(got), dropped, len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("mutation %d = %v, want %v", i, got[i], want[i])
		}
	}
}

// TestReplayKeepsWithinEnvoysLimits: a replay never carries a header Envoy
// refuses, nor more headers or bytes than Envoy accepts in one mutation
// (mutation_utils.cc: over 100 set headers, or a result over 100 headers or
// 60 KiB, rejects the whole mutation), so the marker always arrives.
func TestReplayKeepsWithinEnvoysLimits(t *testing.T) {
	all := func(string) bool { return true }
	for name, value := range map[string]string{"SOH": "a\x01b", "ESC": "\x1b[31m", "DEL": "a\x7f", "NUL": "a\x00"} {
		resp, dropped := replayResponse(&idem.Response{Status: 200, Headers: []idem.Header{{Name: "x-c", Value: value}}}, all)
		if n := len(resp.GetImmediateResponse().GetHeaders().GetSetHeaders()); dropped != 1 || n != 1 {
			t.Errorf("%s: %d mutations, %d dropped; Envoy refuses every control character but HTAB", name, n, dropped)
		}
	}
	if _, dropped := replayResponse(&idem.Response{Status: 200, Headers: []idem.Header{{Name: "x-t", Value: "a\tb"}}}, all); dropped != 0 {
		t.Error("HTAB is a valid header value character")
	}

	for name, r := range map[string]*idem.Response{
		"150 headers": {Status: 201, BodyOmitted: true, Headers: manyHeaders(150, 10)},
		"70 KiB":      {Status: 201, Headers: manyHeaders(10, 7*1024)},
	} {
		resp, dropped := replayResponse(r, all)
		set := resp.GetImmediateResponse().GetHeaders().GetSetHeaders()
		count, bytes := 1+len(set), len(":status")+3 // the local reply's map
		for _, h := range set {
			bytes += len(h.GetHeader().GetKey()) + len(h.GetHeader().GetRawValue())
		}
		if count+2 > envoyMaxHeaders || bytes > envoyMaxHeaderBytes || dropped == 0 {
			t.Errorf("%s: %d headers, %d bytes, %d dropped: over Envoy's limits", name, count, bytes, dropped)
		}
		if set[0].GetHeader().GetKey() != idem.ReplayedHeader || (r.BodyOmitted && set[1].GetHeader().GetKey() != idem.BodyOmittedHeader) {
			t.Errorf("%s: the markers must be kept, first", name)
		}
	}
}

func manyHeaders(n, size int) []idem.Header {
	hs := make([]idem.Header, n)
	for i := range hs {
		hs[i] = idem.Header{Name: "x-h-" + strconv.Itoa(i), Value: strings.Repeat("v", size)}
	}
	return hs
}

// TestHeaderSetBeyondItsRoom: more headers than room was made for still
// come out whole and in order.
func TestHeaderSetBeyondItsRoom(t *testing.T) {
	hs := newHeaderSet(2, 4)
	var want []*corev3.HeaderValueOption
	for i := range 5 {
		v := strconv.Itoa(i) + "-value"
		hs.add("x-h", v, i > 0)
		want = append(want, setHeader("x-h", v, i > 0))
	}
	for i := range want {
		if !proto.Equal(hs.list[i], want[i]) {
			t.Errorf("mutation %d = %v, want %v", i, hs.list[i], want[i])
		}
	}
}

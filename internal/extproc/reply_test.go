package extproc

import (
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// TestReplayHeadersAsSetHeaderBuildsThem: the replay's header mutations,
// built in a few allocations by headerSet, are exactly what one setHeader
// per header gives: the first value of a name overwrites, later ones
// append, unsafe and filtered headers are left out, the marker comes last.
func TestReplayHeadersAsSetHeaderBuildsThem(t *testing.T) {
	r := &idem.Response{Status: 201, Body: []byte("{}"), Headers: []idem.Header{
		{Name: "content-type", Value: "application/json"},
		{Name: "set-cookie", Value: "a=1"},
		{Name: "x-dup", Value: "1"},
		{Name: "x-bad", Value: "split\r\nx: y"},
		{Name: "x-dup", Value: "2"},
		{Name: "x-denied", Value: "v"},
		{Name: ReplayedHeader, Value: "forged"},
		{Name: "location", Value: "/orders/1"},
		{Name: "x-dup", Value: ""},
	}}
	keep := func(name string) bool { return name != "x-denied" }
	want := []*corev3.HeaderValueOption{
		setHeader("content-type", "application/json", false),
		setHeader("set-cookie", "a=1", false),
		setHeader("x-dup", "1", false),
		setHeader("x-dup", "2", true),
		setHeader("location", "/orders/1", false),
		setHeader("x-dup", "", true),
		setHeader(ReplayedHeader, "true", false),
	}
	got := replayResponse(r, keep).GetImmediateResponse().GetHeaders().GetSetHeaders()
	if len(got) != len(want) {
		t.Fatalf("%d mutations, want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("mutation %d = %v, want %v", i, got[i], want[i])
		}
	}
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

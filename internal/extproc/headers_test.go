package extproc

import (
	"fmt"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func headerMap(hs ...*corev3.HeaderValue) *corev3.HeaderMap { return &corev3.HeaderMap{Headers: hs} }

// TestCopyHeaders: the first value of each name, raw_value or value, ""
// and unset for an absent one, and an empty value still present.
func TestCopyHeaders(t *testing.T) {
	m := headerMap(hv(":path", "/a"), hv(":method", "POST"), hv(":path", "/second"),
		&corev3.HeaderValue{Key: ":authority", Value: "old.example"}, hv("x-empty", ""))
	names := []string{":method", ":path", ":authority", "x-request-id", "x-empty"}
	vals := make([]string, len(names))
	present := copyHeaders(m, names, vals)
	if want := []string{"POST", "/a", "old.example", "", ""}; !slices.Equal(vals, want) {
		t.Fatalf("values %q, want %q", vals, want)
	}
	if present != 0b10111 {
		t.Fatalf("present %05b, want 10111", present)
	}
}

// TestKeptHeaders: the kept headers in order with their values (raw_value
// or value, repeats kept), appended after what into holds, also past the
// sixteen whose values share one copy.
func TestKeptHeaders(t *testing.T) {
	keep := func(n string) bool { return n != "x-drop" }
	m := headerMap(hv("content-type", "application/json"), hv("x-drop", "no"),
		&corev3.HeaderValue{Key: "location", Value: "/orders/1"}, hv("set-cookie", "a=1"), hv("set-cookie", "b=2"))
	got := keptHeaders(m, keep, []idem.Header{{Name: "before", Value: "x"}})
	want := []idem.Header{{Name: "before", Value: "x"}, {Name: "content-type", Value: "application/json"},
		{Name: "location", Value: "/orders/1"}, {Name: "set-cookie", Value: "a=1"}, {Name: "set-cookie", Value: "b=2"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	var many []*corev3.HeaderValue
	want = nil
	for i := range 20 {
		many = append(many, hv(fmt.Sprintf("h-%d", i), fmt.Sprint(i)))
		want = append(want, idem.Header{Name: fmt.Sprintf("h-%d", i), Value: fmt.Sprint(i)})
	}
	if got := keptHeaders(headerMap(many...), keep, nil); !slices.Equal(got, want) {
		t.Fatalf("20 headers: got %q", got)
	}
	if got := keptHeaders(headerMap(hv("x-drop", "no")), keep, nil); len(got) != 0 {
		t.Fatalf("nothing kept: got %q", got)
	}
}

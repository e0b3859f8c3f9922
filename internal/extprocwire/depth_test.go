package extprocwire

import (
	"sort"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// nestedStruct is a google.protobuf.Struct that costs the generic decoder
// u units of depth beyond its own: u/3 levels of fields["a"].struct_value
// (struct.proto: Struct.fields 1, Value.struct_value 5; a map entry and a
// Value are a unit each), the innermost Struct then holding a key-only
// entry (u%3 == 1) or an entry with an empty Value (u%3 == 2). It is
// written back to front so that it costs O(u).
func nestedStruct(u int) []byte {
	buf := make([]byte, 6*u+16)
	at := len(buf)
	prepend := func(p []byte) { at -= len(p); copy(buf[at:], p) }
	field := func(num protowire.Number, n int) { // the tag and length of the n bytes after at
		prepend(protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.BytesType), uint64(n)))
	}
	switch u % 3 {
	case 1:
		prepend(lenField(1, lenField(1, []byte("a"))))
	case 2:
		prepend(lenField(1, lenField(1, []byte("a")), lenField(2, nil)))
	}
	for range u / 3 {
		field(5, len(buf)-at) // Value.struct_value: the inner Struct
		field(2, len(buf)-at) // the entry's value
		prepend([]byte("a"))
		field(1, 1)           // the entry's key
		field(1, len(buf)-at) // Struct.fields: the entry
	}
	return buf[at:]
}

// TestDepthLimit: a Struct nested up to proto's recursion limit is
// accepted by both decoders and one level more rejected by both, wherever
// the fast decoder hands a Struct to proto (the depth it has spent before
// must match the generic decoder's count).
func TestDepthLimit(t *testing.T) {
	if got, want := nestedStruct(3*3+2), func() []byte { // the builder against the plain one
		s := lenField(1, lenField(1, []byte("a")), lenField(2, nil))
		for range 3 {
			s = lenField(1, lenField(1, []byte("a")), lenField(2, lenField(5, s)))
		}
		return s
	}(); string(got) != string(want) {
		t.Fatalf("nestedStruct(11) = %x, want %x", got, want)
	}
	for name, place := range map[string]func(s []byte) []byte{
		"attributes":                   func(s []byte) []byte { return lenField(9, lenField(1, []byte("k")), lenField(2, s)) },
		"deprecated header attributes": func(s []byte) []byte { return lenField(2, lenField(2, lenField(1, []byte("k")), lenField(2, s))) },
		"metadata context":             func(s []byte) []byte { return lenField(8, lenField(1, lenField(1, []byte("k")), lenField(2, s))) },
	} {
		t.Run(name, func(t *testing.T) {
			fails := func(k int) bool {
				return proto.Unmarshal(place(nestedStruct(k)), new(extprocv3.ProcessingRequest)) != nil
			}
			k := sort.Search(12000, fails) // the shallowest nesting proto rejects
			if k == 0 || k == 12000 {
				t.Fatalf("no depth boundary below 12000 (first failure at %d)", k)
			}
			for _, depth := range []int{k - 1, k} {
				checkRequest(t, place(nestedStruct(depth)))
			}
		})
	}
}

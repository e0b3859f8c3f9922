package extproc

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
)

// TestHeldEchoSendsTheBodyBack: a withheld body comes back whole and in
// order. In GRPC mode each message is one reply with its compressed flag,
// an empty message included (grpc-go forwards each reply as one message);
// otherwise the bytes are coalesced into replies of at most maxEchoBytes,
// each within the 32 KiB buffers of gRPC's pool (see maxEchoBytes).
func TestHeldEchoSendsTheBodyBack(t *testing.T) {
	var framed []byte
	msgs := []struct {
		body       string
		compressed bool
	}{{"m1", false}, {"", false}, {"zz", true}}
	for _, m := range msgs {
		framed = keep(framed, []byte(m.body), true, m.compressed, 0)
	}
	e := heldEcho{body: framed, phase: phaseResponseBody, framed: true}
	for i, m := range msgs {
		r := e.next()
		sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if sr == nil || string(sr.GetBody()) != m.body || sr.GetGrpcMessageCompressed() != m.compressed || sr.GetEndOfStream() {
			t.Fatalf("message %d: reply %v, want body %q compressed %v", i, r, m.body, m.compressed)
		}
	}
	if r := e.next(); r != nil {
		t.Fatalf("a reply past the last message: %v", r)
	}

	body := bytes.Repeat([]byte("0123456789"), (2*maxEchoBytes+1000)/10)
	var kept []byte
	for c := range slices.Chunk(body, 7) {
		kept = keep(kept, c, false, false, 0)
	}
	e = heldEcho{body: kept, phase: phaseRequestBody}
	var got []byte
	var sizes []int
	for r := e.next(); r != nil; r = e.next() {
		b := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()
		got, sizes = append(got, b...), append(sizes, len(b))
		if n := proto.Size(r); n > 32<<10 {
			t.Errorf("a reply of %d bytes, more than the pool's 32 KiB buffers", n)
		}
	}
	if !bytes.Equal(got, body) || len(sizes) != 3 || sizes[0] != maxEchoBytes || sizes[1] != maxEchoBytes {
		t.Fatalf("%d bytes back in replies of %v, want the %d bytes in two of %d and the rest", len(got), sizes, len(body), maxEchoBytes)
	}
}

package extproc

import (
	"encoding/binary"
	"strconv"
)

// A body is read into one buffer, for the fingerprint (a request) or the
// record (a response), and what holding it costs is what the server's
// body budget counts: the buffer's capacity, not only the bytes read.
//
// Resident memory is the buffer and the garbage made while filling it,
// which the collector lets build up to --gc-percent of the live heap
// before it runs. Two things keep that garbage near one body's worth:
//   - A body that declares its length (content-length) gets a buffer of
//     that size at its first chunk, so it is never copied. A declared
//     length is only a hint: one past the policy's limit is ignored, and a
//     body that runs past its own grows as below.
//   - Otherwise the buffer doubles as it grows, which copies a body about
//     once. append's own growth for large slices is about 1.25× at a time
//     (runtime/slice.go nextslicecap), which copied a body about four times
//     over while it arrived.
//
// Capacity not yet written is not resident: a large allocation taken fresh
// from the kernel is not written until used (runtime/malloc.go
// mallocgcLarge zeroes a span only when it was used before, needzero). But
// the collector counts it, and a client could declare a length it never
// sends, so the budget is charged the capacity.

// chunkCapacity is the capacity body needs to keep n more bytes (a chunk
// and, framed, its prefix): its own when they fit, the chunk's for a first
// chunk kept as it came (keepChunk), the declared length expect (0 when
// unknown) when they fit in that, else twice what is kept. A declared
// length past limit is not believed: such a body is refused, or not
// stored, before it gets there.
func chunkCapacity(body []byte, n int, framed bool, expect, limit int) int {
	if expect > limit {
		expect = 0
	}
	switch {
	case body == nil && !framed && expect <= n:
		return n
	case cap(body)-len(body) >= n:
		return cap(body)
	case expect >= len(body)+n:
		return expect
	}
	return max(2*len(body), len(body)+n)
}

// keepChunk appends a body chunk to body, in a buffer of the given
// capacity (chunkCapacity), framed in GRPC mode as gRPC frames its
// messages on the wire (the compressed flag and the message's length,
// PROTOCOL-HTTP2.md Length-Prefixed-Message), so that message boundaries
// are part of the fingerprint. The first chunk of a body that declares no
// more is kept as it came, not copied: a BUFFERED body, whole in one
// message, costs no second copy. The message's bytes are the server's own
// (extprocwire's Unmarshal copies each message out of gRPC's buffers once;
// google.golang.org/protobuf copies each bytes field it decodes,
// internal/impl consumeBytes) and nothing writes to them; the capacity is
// cut to the chunk so that the next chunk is copied instead of written
// past it.
func keepChunk(body, msg []byte, framed, compressed bool, capacity int) []byte {
	if body == nil && !framed && capacity == len(msg) {
		return msg[:len(msg):len(msg)]
	}
	if capacity > cap(body) {
		b := make([]byte, len(body), capacity)
		copy(b, body)
		body = b
	}
	if framed {
		var prefix [frameHeaderLen]byte
		if compressed {
			prefix[0] = 1
		}
		binary.BigEndian.PutUint32(prefix[1:], uint32(len(msg)))
		body = append(body, prefix[:]...)
	}
	return append(body, msg...)
}

// declaredLength is a body's content-length; 0 when the header is absent
// or not a length.
func declaredLength(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

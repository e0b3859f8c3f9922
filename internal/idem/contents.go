package idem

import (
	"encoding/binary"
	"errors"
)

// ErrMalformedContents is ParseContents' answer to bytes AppendContents
// did not write.
var ErrMalformedContents = errors.New("malformed contents")

// AppendContents appends a response's headers and body to b as one byte
// string, the form both an envelope (package seal) and a compressed frame
// (package compress) hold: uvarint header count, per header uvarint name
// length, name, uvarint value length, value; then the body. Status and
// flags are not part of it: they stay readable beside it.
func AppendContents(b []byte, r *Response) []byte {
	b = binary.AppendUvarint(b, uint64(len(r.Headers)))
	for _, h := range r.Headers {
		b = binary.AppendUvarint(b, uint64(len(h.Name)))
		b = append(b, h.Name...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return append(b, r.Body...)
}

// ContentsSize is the length AppendContents adds for r.
func ContentsSize(r *Response) int {
	n := uvarintLen(uint64(len(r.Headers))) + len(r.Body)
	for _, h := range r.Headers {
		n += uvarintLen(uint64(len(h.Name))) + len(h.Name) + uvarintLen(uint64(len(h.Value))) + len(h.Value)
	}
	return n
}

func uvarintLen(v uint64) int {
	n := 1
	for ; v >= 0x80; v >>= 7 {
		n++
	}
	return n
}

// ParseContents reverses AppendContents. The body is a slice of b; the
// headers are slices of one string holding their bytes (one copy for them
// all, whatever their number). It checks every length, whoever wrote b: a
// record can be changed in the store, and a seal key can leak.
func ParseContents(b []byte) (Response, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return Response{}, errors.Join(ErrMalformedContents, errors.New("header count"))
	}
	// First the lengths, to find where the headers end; then the headers,
	// out of one string.
	end := k
	for range 2 * n {
		l, k := binary.Uvarint(b[end:])
		if k <= 0 || l > uint64(len(b)-end-k) {
			return Response{}, errors.Join(ErrMalformedContents, errors.New("a header runs past the end"))
		}
		end += k + int(l)
	}
	var out Response
	if n > 0 {
		out.Headers = make([]Header, 0, n)
		hs := string(b[:end])
		at := k
		next := func() string {
			l, k := binary.Uvarint(b[at:])
			v := hs[at+k : at+k+int(l)]
			at += k + int(l)
			return v
		}
		for range n {
			name := next()
			out.Headers = append(out.Headers, Header{Name: name, Value: next()})
		}
	}
	if end < len(b) {
		out.Body = b[end:]
	}
	return out, nil
}

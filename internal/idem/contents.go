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
// headers are copies. It checks every length, whoever wrote b: a record
// can be changed in the store, and a seal key can leak.
func ParseContents(b []byte) (Response, error) {
	var out Response
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return Response{}, errors.Join(ErrMalformedContents, errors.New("header count"))
	}
	b = b[k:]
	if n > 0 {
		out.Headers = make([]Header, 0, n)
	}
	for range n {
		name, rest, ok := cutString(b)
		if !ok {
			return Response{}, errors.Join(ErrMalformedContents, errors.New("a header runs past the end"))
		}
		value, rest, ok := cutString(rest)
		if !ok {
			return Response{}, errors.Join(ErrMalformedContents, errors.New("a header runs past the end"))
		}
		out.Headers = append(out.Headers, Header{Name: name, Value: value})
		b = rest
	}
	if len(b) > 0 {
		out.Body = b
	}
	return out, nil
}

func cutString(b []byte) (string, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return "", b, false
	}
	b = b[k:]
	return string(b[:n]), b[n:], true
}

package redisstore

import (
	"encoding/binary"
	"errors"
	"strconv"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

var errCorrupt = errors.New("redisstore: corrupt stored headers")

// encodeHeaders packs headers as uvarint count, then per header uvarint
// name length, name, uvarint value length, value. It is binary-safe and far
// smaller than JSON for the usual handful of headers.
func encodeHeaders(hs []idem.Header) []byte {
	n := binary.MaxVarintLen64
	for _, h := range hs {
		n += 2*binary.MaxVarintLen64 + len(h.Name) + len(h.Value)
	}
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(hs)))
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Name)))
		b = append(b, h.Name...)
		b = binary.AppendUvarint(b, uint64(len(h.Value)))
		b = append(b, h.Value...)
	}
	return b
}

// decodeHeaders reverses encodeHeaders. Given the string Redis returned, the
// names and values are slices of it, not copies: a replay decodes every
// stored header.
func decodeHeaders[T ~string | ~[]byte](b T) ([]idem.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	count, b, err := uvarint(b)
	if err != nil {
		return nil, err
	}
	if count > uint64(len(b)) { // every header takes at least two bytes
		return nil, errCorrupt
	}
	hs := make([]idem.Header, 0, count)
	for range count {
		var name, value string
		if name, b, err = lenString(b); err != nil {
			return nil, err
		}
		if value, b, err = lenString(b); err != nil {
			return nil, err
		}
		hs = append(hs, idem.Header{Name: name, Value: value})
	}
	if len(b) != 0 {
		return nil, errCorrupt
	}
	return hs, nil
}

// uvarint decodes what binary.AppendUvarint encodes.
func uvarint[T ~string | ~[]byte](b T) (uint64, T, error) {
	var v uint64
	for i := 0; i < len(b) && i < binary.MaxVarintLen64; i++ {
		c := b[i]
		if i == binary.MaxVarintLen64-1 && c > 1 {
			return 0, b, errCorrupt // overflows 64 bits
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, b[i+1:], nil
		}
	}
	return 0, b, errCorrupt
}

func lenString[T ~string | ~[]byte](b T) (string, T, error) {
	n, b, err := uvarint(b)
	if err != nil {
		return "", b, err
	}
	if n > uint64(len(b)) {
		return "", b, errCorrupt
	}
	return string(b[:n]), b[n:], nil
}

// Response flags, stored in the record's "o" field.
const (
	flagBodyOmitted = 1 << iota
	flagSealed
)

func encodeFlags(r *idem.Response) string {
	f := 0
	if r.BodyOmitted {
		f |= flagBodyOmitted
	}
	if r.Sealed {
		f |= flagSealed
	}
	return strconv.Itoa(f)
}

func decodeFlags(s string, r *idem.Response) {
	f, _ := strconv.Atoi(s)
	r.BodyOmitted = f&flagBodyOmitted != 0
	r.Sealed = f&flagSealed != 0
}

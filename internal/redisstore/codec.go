package redisstore

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// errCorrupt is a stored record this package cannot decode.
var errCorrupt = idem.ErrDamaged

// encodeHeaders packs headers as uvarint count, then per header uvarint
// name length, name, uvarint value length, value. It is binary-safe and far
// smaller than JSON for the usual handful of headers.
func encodeHeaders(hs []idem.Header) []byte {
	return appendHeaders(make([]byte, 0, headersSize(hs)), hs)
}

// headersSize bounds the length of hs encoded.
func headersSize(hs []idem.Header) int {
	n := binary.MaxVarintLen64
	for _, h := range hs {
		n += 2*binary.MaxVarintLen64 + len(h.Name) + len(h.Value)
	}
	return n
}

// appendHeaders appends hs to b as encodeHeaders packs them.
func appendHeaders(b []byte, hs []idem.Header) []byte {
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
	hs, rest, err := decodeHeadersPrefix(b)
	if err == nil && len(rest) != 0 {
		return nil, errCorrupt
	}
	return hs, err
}

// decodeHeadersPrefix decodes the headers encodeHeaders wrote at the start
// of b and returns what follows them. Even no headers take a byte (the
// count): an empty b is a record cut short.
func decodeHeadersPrefix[T ~string | ~[]byte](b T) ([]idem.Header, T, error) {
	count, b, err := uvarint(b)
	if err != nil {
		return nil, b, err
	}
	if count > uint64(len(b)) { // every header takes at least two bytes
		return nil, b, errCorrupt
	}
	hs := make([]idem.Header, 0, count)
	for range count {
		var name, value string
		if name, b, err = lenString(b); err != nil {
			return nil, b, err
		}
		if value, b, err = lenString(b); err != nil {
			return nil, b, err
		}
		hs = append(hs, idem.Header{Name: name, Value: value})
	}
	return hs, b, nil
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

// Response flags, one byte of an encoded response.
const (
	flagBodyOmitted = 1 << iota
	flagSealed
	// flagCompressed: the body is a compressed frame (package compress).
	// Records written before it existed have the bit clear.
	flagCompressed
)

func encodeFlags(r *idem.Response) byte {
	var f byte
	if r.BodyOmitted {
		f |= flagBodyOmitted
	}
	if r.Sealed {
		f |= flagSealed
	}
	if r.Compressed {
		f |= flagCompressed
	}
	return f
}

func decodeFlags(f byte, r *idem.Response) {
	r.BodyOmitted = f&flagBodyOmitted != 0
	r.Sealed = f&flagSealed != 0
	r.Compressed = f&flagCompressed != 0
}

// encodeResponseHead packs what comes before a response's body: uvarint
// status, one flags byte, then the headers as encodeHeaders writes them.
// The scripts append the body, passed apart so that it is never copied
// into a second buffer here; a completed record stores head and body after
// its own fixed head (see completedHeadLen).
func encodeResponseHead(r *idem.Response) []byte {
	b := make([]byte, 0, binary.MaxVarintLen64+1+headersSize(r.Headers))
	b = binary.AppendUvarint(b, uint64(r.Status))
	b = append(b, encodeFlags(r))
	return appendHeaders(b, r.Headers)
}

// decodeResponse decodes a response head followed by its body. Headers are slices of b when b is
// a string; the body is always a copy the caller owns.
func decodeResponse[T ~string | ~[]byte](b T) (*idem.Response, error) {
	st, b, err := uvarint(b)
	if err != nil {
		return nil, err
	}
	if st < 100 || st > 999 || len(b) == 0 {
		return nil, errCorrupt
	}
	resp := &idem.Response{Status: int(st)}
	decodeFlags(b[0], resp)
	if resp.Headers, b, err = decodeHeadersPrefix(b[1:]); err != nil {
		return nil, err
	}
	if len(b) > 0 {
		resp.Body = []byte(b)
	}
	return resp, nil
}

// A completed record is one Redis string rather than a hash: a 1 KiB body
// pushes a hash past hash-max-listpack-value into a hashtable, whose
// per-field entries cost more than the body itself (docs/design.md §6 bounds
// memory per record; docs/performance.md has the figures). The string
// starts with a fixed-width head the Lua scripts read and update by
// offset, then the response head (encodeResponseHead) and the body. Its
// first byte names the layout of that head. Every record is written in the
// sized layout:
//
//	offset  0     "e"
//	offset  1     fingerprint, 32 bytes
//	offset 33     token, 16 bytes
//	offset 49     attempts, 4 bytes big-endian unsigned (SETRANGE-d on
//	              each replay; it stops at 2^32-1 rather than wrap)
//	offset 53     created, Unix ms, 6 bytes big-endian unsigned (to the
//	              year 10889)
//	offset 59     the whole string's length, 4 bytes big-endian unsigned
//	offset 63     the response
//
// The body carries no length of its own, so without the string's length a
// record cut inside the body of a response neither sealed nor compressed
// would read as a shorter whole one; with it, a record cut or grown
// anywhere is damaged (record.lib checks it before reading anything else,
// completedHeadLen again).
//
// Records written before it are still read, replayed and counted in their
// own layout until their retention ends, without that check: the compact
// layout, the same head less the length,
//
//	offset  0     "d"
//	offset  1..58 as in the sized layout
//	offset 59     the response
//
// and, before it, the decimal layout:
//
//	offset  0     "c"
//	offset  1     fingerprint, 32 bytes
//	offset 33     token, 16 bytes
//	offset 49     attempts, 10 decimal digits (SETRANGE-d on each replay)
//	offset 59     created, Unix ms, 15 decimal digits
//	offset 74     the response
//
// The scripts read and write the binary numbers with the struct library
// Redis loads into every script's Lua (src/script_lua.c, luaLoadLibraries;
// deps/lua/src/lua_struct.c), whose integer sizes are powers of two:
// created is packed as ">I2I4", its high 16 and low 32 bits.
//
// In-flight and unknown records stay small hashes (see reserve.lua).
const (
	layoutSized   = 'e'
	layoutCompact = 'd'
	layoutDecimal = 'c'

	recordFPAt      = 1
	recordTokenAt   = 33
	recordAttemptAt = 49 // in every layout

	// sizedHeadLen is the length of the sized layout's fixed head, whose
	// last 4 bytes (at sizedLenAt) are the whole string's length.
	sizedHeadLen = 63
	sizedLenAt   = 59

	// compactHeadLen is the length of the compact layout's fixed head;
	// the sized layout's starts the same.
	compactHeadLen   = 59
	compactCreatedAt = 53

	// decimalHeadLen is the length of the decimal layout's fixed head.
	decimalHeadLen   = 74
	decimalCreatedAt = 59
)

// completedHeadLen is the length of the fixed head of the completed
// record v, by its layout, or 0 when v is not one: a sized record whose
// length is not the one its head states is none.
func completedHeadLen(v string) int {
	switch {
	case len(v) >= sizedHeadLen && v[0] == layoutSized:
		if bigEndian(v[sizedLenAt:sizedHeadLen]) != uint64(len(v)) {
			return 0
		}
		return sizedHeadLen
	case len(v) >= compactHeadLen && v[0] == layoutCompact:
		return compactHeadLen
	case len(v) >= decimalHeadLen && v[0] == layoutDecimal:
		return decimalHeadLen
	}
	return 0
}

// parseCompleted decodes a completed record's string, in any layout.
func parseCompleted(v string) (idem.Record, error) {
	var rec idem.Record
	n := completedHeadLen(v)
	if n == 0 {
		return rec, errCorrupt
	}
	rec.State = idem.StateCompleted
	copy(rec.Fingerprint[:], v[recordFPAt:recordTokenAt])
	copy(rec.Token[:], v[recordTokenAt:recordAttemptAt])
	if n != decimalHeadLen {
		rec.Attempts = int(bigEndian(v[recordAttemptAt:compactCreatedAt]))
		rec.CreatedAt = time.UnixMilli(int64(bigEndian(v[compactCreatedAt:compactHeadLen])))
	} else {
		a, err := strconv.Atoi(v[recordAttemptAt:decimalCreatedAt])
		if err != nil {
			return rec, errCorrupt
		}
		rec.Attempts = a
		ms, err := strconv.ParseInt(v[decimalCreatedAt:decimalHeadLen], 10, 64)
		if err != nil {
			return rec, errCorrupt
		}
		rec.CreatedAt = time.UnixMilli(ms)
	}
	var err error
	if rec.Response, err = decodeResponse(v[n:]); err != nil {
		return rec, err
	}
	return rec, nil
}

// bigEndian reads s, at most 8 bytes, as a big-endian unsigned integer.
func bigEndian(s string) uint64 {
	var v uint64
	for i := range len(s) {
		v = v<<8 | uint64(s[i])
	}
	return v
}

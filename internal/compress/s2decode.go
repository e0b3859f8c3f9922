package compress

import (
	"encoding/binary"

	"github.com/klauspost/compress/s2"
)

// decodeS2Dict writes to dst, whose length is the block's decoded length,
// the S2 block src (the elements after that length) made with the
// dictionary dict and its initial repeat offset repeat, and reports
// whether src was a whole, valid block for dst.
//
// It reads what s2.Dict.Decode reads, the same way, and refuses what it
// refuses (github.com/klauspost/compress/s2, decode.go, s2DecodeDict:
// Snappy's literals and copies, S2's repeat codes, a copy reaching past
// the block's start taken from the dictionary's end while the block is
// under s2.MaxDictSrcOffset); FuzzDecodeS2Dict holds the two to the same
// output and the same refusals. It differs in one thing: a copy that
// overlaps what it writes (offset below length: a run of one byte, of a
// few) is made by copies doubling in length, where s2DecodeDict goes
// byte by byte; a 1 KiB run of one byte expanded in about 2 µs that way,
// twice an object answer's whole expansion.
func decodeS2Dict(dst, src, dict []byte, repeat int) bool {
	d, s := 0, 0
	offset := len(dict) - repeat // S2's repeat offset before the first copy
	for s < len(src) {
		if tag := src[s]; tag&3 == 0 { // a literal
			n, at, ok := int(tag>>2)+1, s+1, true
			if tag >= 60<<2 { // its length in the bytes after the tag
				n, at, ok = s2Literal(src, s)
			}
			if !ok || n > len(dst)-d || n > len(src)-at {
				return false
			}
			d += copy(dst[d:], src[at:at+n])
			s = at + n
			continue
		}
		n, o, again, next, ok := s2Copy(src, s)
		if !ok {
			return false
		}
		if !again {
			offset = o
		}
		s = next
		if d, ok = s2CopyTo(dst, d, dict, offset, n); !ok {
			return false
		}
	}
	return d == len(dst)
}

// s2Literal reads the literal whose tag is at src[s]: its length and
// where its bytes start.
func s2Literal(src []byte, s int) (n, at int, ok bool) {
	x := uint32(src[s] >> 2)
	switch {
	case x < 60:
		s++
	case x == 60:
		if s += 2; s > len(src) {
			return 0, 0, false
		}
		x = uint32(src[s-1])
	case x == 61:
		if s += 3; s > len(src) {
			return 0, 0, false
		}
		x = uint32(binary.LittleEndian.Uint16(src[s-2:]))
	case x == 62:
		if s += 4; s > len(src) {
			return 0, 0, false
		}
		x = binary.LittleEndian.Uint32(src[s-4:]) >> 8
	default:
		if s += 5; s > len(src) {
			return 0, 0, false
		}
		x = binary.LittleEndian.Uint32(src[s-4:])
	}
	n = int(x) + 1
	return n, s, n > 0
}

// s2Copy reads the copy whose tag is at src[s]: its length, its offset
// unless it repeats the last one (again: S2's repeat code, a 1-byte-offset
// copy of offset 0), and where the next element starts.
func s2Copy(src []byte, s int) (n, offset int, again bool, next int, ok bool) {
	tag := src[s]
	switch tag & 3 {
	case 1: // a copy of 4 to 11 bytes, or a repeat
		if s += 2; s > len(src) {
			return 0, 0, false, 0, false
		}
		n = int(tag >> 2 & 7)
		if offset = int(tag&0xe0)<<3 | int(src[s-1]); offset != 0 {
			return n + 4, offset, false, s, true
		}
		switch n {
		case 5:
			if s++; s > len(src) {
				return 0, 0, false, 0, false
			}
			n = int(src[s-1]) + 4
		case 6:
			if s += 2; s > len(src) {
				return 0, 0, false, 0, false
			}
			n = int(binary.LittleEndian.Uint16(src[s-2:])) + 1<<8
		case 7:
			if s += 3; s > len(src) {
				return 0, 0, false, 0, false
			}
			n = int(src[s-3]) | int(src[s-2])<<8 | int(src[s-1])<<16 + 1<<16
		}
		return n + 4, 0, true, s, true
	case 2: // a copy with a 2-byte offset
		if s += 3; s > len(src) {
			return 0, 0, false, 0, false
		}
		return 1 + int(tag>>2), int(binary.LittleEndian.Uint16(src[s-2:])), false, s, true
	default: // a copy with a 4-byte offset
		if s += 5; s > len(src) {
			return 0, 0, false, 0, false
		}
		return 1 + int(tag>>2), int(binary.LittleEndian.Uint32(src[s-4:])), false, s, true
	}
}

// s2CopyTo writes at dst[d:] the n bytes from offset back, from the
// dictionary's end when the offset reaches past the block's start, and
// returns where the block goes on.
func s2CopyTo(dst []byte, d int, dict []byte, offset, n int) (int, bool) {
	if offset <= 0 || n > len(dst)-d {
		return d, false
	}
	if d < offset { // from the dictionary
		from := len(dict) - (offset - d)
		if d > s2.MaxDictSrcOffset || from < 0 || from+n > len(dict) {
			return d, false
		}
		return d + copy(dst[d:d+n], dict[from:]), true
	}
	from, end := d-offset, d+n
	if offset >= n {
		return d + copy(dst[d:end], dst[from:]), true
	}
	// dst[from:d] is one period of what the copy repeats; each copy
	// doubles what is written, a whole number of periods, until the last.
	for d < end {
		d += copy(dst[d:end], dst[from:d])
	}
	return d, true
}

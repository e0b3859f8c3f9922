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
		tag := src[s]
		length := 0
		switch tag & 3 {
		case 0: // a literal
			x := uint32(tag >> 2)
			switch {
			case x < 60:
				s++
			case x == 60:
				if s += 2; s > len(src) {
					return false
				}
				x = uint32(src[s-1])
			case x == 61:
				if s += 3; s > len(src) {
					return false
				}
				x = uint32(binary.LittleEndian.Uint16(src[s-2:]))
			case x == 62:
				if s += 4; s > len(src) {
					return false
				}
				x = binary.LittleEndian.Uint32(src[s-4:]) >> 8
			default:
				if s += 5; s > len(src) {
					return false
				}
				x = binary.LittleEndian.Uint32(src[s-4:])
			}
			length = int(x) + 1
			if length <= 0 || length > len(dst)-d || length > len(src)-s {
				return false
			}
			copy(dst[d:], src[s:s+length])
			d += length
			s += length
			continue
		case 1: // a copy of 4 to 11 bytes, or S2's repeat of the last offset
			if s += 2; s > len(src) {
				return false
			}
			length = int(src[s-2] >> 2 & 7)
			if o := int(src[s-2]&0xe0)<<3 | int(src[s-1]); o != 0 {
				offset = o
			} else {
				switch length {
				case 5:
					if s++; s > len(src) {
						return false
					}
					length = int(src[s-1]) + 4
				case 6:
					if s += 2; s > len(src) {
						return false
					}
					length = int(binary.LittleEndian.Uint16(src[s-2:])) + 1<<8
				case 7:
					if s += 3; s > len(src) {
						return false
					}
					length = int(src[s-3]) | int(src[s-2])<<8 | int(src[s-1])<<16 + 1<<16
				}
			}
			length += 4
		case 2: // a copy with a 2-byte offset
			if s += 3; s > len(src) {
				return false
			}
			length = 1 + int(src[s-3]>>2)
			offset = int(binary.LittleEndian.Uint16(src[s-2:]))
		case 3: // a copy with a 4-byte offset
			if s += 5; s > len(src) {
				return false
			}
			length = 1 + int(src[s-5]>>2)
			offset = int(binary.LittleEndian.Uint32(src[s-4:]))
		}
		if offset <= 0 || length > len(dst)-d {
			return false
		}
		if d < offset { // from the dictionary
			if d > s2.MaxDictSrcOffset {
				return false
			}
			from := len(dict) - (offset - d)
			if from < 0 || from+length > len(dict) {
				return false
			}
			d += copy(dst[d:d+length], dict[from:])
			continue
		}
		from, end := d-offset, d+length
		if offset >= length {
			d += copy(dst[d:end], dst[from:])
			continue
		}
		// dst[from:d] is one period of what the copy repeats; each copy
		// doubles what is written, a whole number of periods, until the
		// last.
		for d < end {
			d += copy(dst[d:end], dst[from:d])
		}
	}
	return d == len(dst)
}

package extprocwire

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The wire primitives both directions share: a field parsed from the
// front of a message (the one step of every decoder's walk), and the sizes
// and appends of varint and length-delimited fields, with the encoder's
// two-pass length bookkeeping.

// field is one parsed field: a varint's value or a length-delimited
// field's bytes (a sub-slice of the input, capacity to its end).
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	s   []byte
}

// next parses the field at the front of b and returns it with what
// follows. A field it cannot parse (anything but a valid tag with a varint,
// length-delimited or fixed64 value) comes back as number 0 with nothing
// after it. No field has number 0 (google.golang.org/protobuf
// encoding/protowire/wire.go, ConsumeTag, refuses it), so a decoder
// refuses that field as it refuses any it does not know, and its walk over
// a message needs no error check of its own:
//
//	for len(b) > 0 {
//		f, rest := next(b)
//		b = rest
//		switch { /* the fields it knows */ default: return false }
//	}
func next(b []byte) (f field, rest []byte) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber {
		return field{}, nil
	}
	b = b[n:]
	f.num, f.typ = num, typ
	switch typ {
	case protowire.VarintType:
		f.v, n = protowire.ConsumeVarint(b)
	case protowire.BytesType:
		f.s, n = protowire.ConsumeBytes(b)
	case protowire.Fixed64Type: // only Value.number_value takes one
		f.v, n = protowire.ConsumeFixed64(b)
	default:
		return field{}, nil
	}
	if n < 0 {
		return field{}, nil
	}
	return f, b[n:]
}

// repeated counts the fields of b, reporting false unless every one is a
// length-delimited field num: the elements of a repeated message field,
// counted to allocate them together before they are decoded.
func repeated(b []byte, num protowire.Number) (int, bool) {
	n := 0
	for ; len(b) > 0; n++ {
		f, rest := next(b)
		if f.num != num || !f.isBytes() {
			return 0, false
		}
		b = rest
	}
	return n, true
}

// varints hands each field of b, a message of varint fields only, to set,
// and reports false for a field of another type, a damaged one, or one set
// refuses (a number it does not know, 0 among them).
func varints(b []byte, set func(num protowire.Number, v uint64) bool) bool {
	for len(b) > 0 {
		f, rest := next(b)
		if !f.isVarint() || !set(f.num, f.v) {
			return false
		}
		b = rest
	}
	return true
}

// int64s decodes b, a message of int64 fields numbered 1 to len(dst), field
// n into *dst[n-1], reporting false for any other field.
func int64s(b []byte, dst ...*int64) bool {
	return varints(b, func(num protowire.Number, v uint64) bool {
		if num < 1 || int(num) > len(dst) {
			return false
		}
		*dst[num-1] = int64(v)
		return true
	})
}

func (f field) isBytes() bool { return f.typ == protowire.BytesType }

func (f field) isVarint() bool { return f.typ == protowire.VarintType }

// bytesField is a proto3 bytes field's value: nil when empty, as the generic
// decoder leaves it, else s with its capacity clipped so that an append
// cannot run into the next field.
func bytesField(s []byte) []byte {
	if len(s) == 0 {
		return nil
	}
	return s[:len(s):len(s)]
}

// open reserves the slot of a nested message's length in the size pass.
func (e *encoder) open() int {
	e.n++
	if e.n > len(e.stack) {
		e.more = append(e.more, 0)
	}
	return e.n - 1
}

// closeMsg records the nested message's content length n in its slot and
// returns the field's whole size (tag, length and content).
func (e *encoder) closeMsg(slot int, num protowire.Number, n int) int {
	if slot < len(e.stack) {
		e.stack[slot] = n
	} else {
		e.more[slot-len(e.stack)] = n
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

// head writes a nested message's tag and length in the append pass.
func (e *encoder) head(b []byte, num protowire.Number) []byte {
	var n int
	if e.next < len(e.stack) {
		n = e.stack[e.next]
	} else {
		n = e.more[e.next-len(e.stack)]
	}
	e.next++
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// plain reports that m carries no unknown fields, which only proto.Marshal
// writes back.
func plain(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) == 0 }

func sizeVarint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// enum is an enum's varint: a negative value is sign-extended to 64 bits.
func enum(v int32) uint64 { return uint64(int64(v)) }

func boolean(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

func sizeBytes(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendString(b []byte, num protowire.Number, v string) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, v)
}

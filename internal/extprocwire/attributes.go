package extprocwire

import (
	"math"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The attributes family: the map<string, google.protobuf.Struct> of
// ProcessingRequest.attributes (and the deprecated HttpHeaders.attributes),
// read flat when Envoy's shape allows, else by proto.

// structEntry decodes one map<string, google.protobuf.Struct> entry into
// into. As in the generic decoder (codec_map.go, consumeMapOfMessage) an
// entry's missing key is "", its missing value an empty Struct, a value
// given twice in one entry merges, and a later entry for the same key
// replaces the earlier one. A flat Struct (flatStruct), the shape of
// Envoy's attributes, is decoded here; any other is left to proto, with
// the depth budget left at the entry (limit).
func (d *decoder) structEntry(b []byte, into map[string]*structpb.Struct, limit int) bool {
	var key string
	val := new(structpb.Struct)
	seen := false
	for len(b) > 0 {
		f, rest := next(b)
		b = rest
		switch {
		case f.num == 1 && f.isBytes():
			var ok bool
			if key, ok = d.string(f.s); !ok {
				return false
			}
		case f.num == 2 && f.isBytes():
			if !seen && d.flatStruct(f.s, val) {
				seen = true
				continue
			}
			if !seen {
				val.Reset() // what flatStruct filled before it gave up
			}
			seen = true
			if (proto.UnmarshalOptions{Merge: true, RecursionLimit: limit}).Unmarshal(f.s, val) != nil {
				return false
			}
		default:
			return false
		}
	}
	into[key] = val
	return true
}

// flatStruct decodes the Struct Envoy sends as attributes
// (google/protobuf/struct.proto: Struct.fields 1, a map of Value; Value's
// kind a oneof of null_value 1, number_value 2, string_value 3, bool_value
// 4, struct_value 5, list_value 6) when every value is a scalar set once:
// the Values share one array and the strings are substrings of the
// message. Anything else (a nested Struct or list, a Value or map entry
// with a field twice, an unknown field) reports false for proto to decode.
func (d *decoder) flatStruct(b []byte, s *structpb.Struct) bool {
	n, ok := repeated(b, 1)
	if !ok || n == 0 {
		return ok
	}
	vals := make([]structpb.Value, n)
	s.Fields = make(map[string]*structpb.Value, n)
	d.strKinds = nil // this Struct's string kinds share one array, made at the first
	for i := range vals {
		f, rest := next(b)
		b = rest
		d.strLeft = n - i
		key, ok := d.flatEntry(f.s, &vals[i])
		if !ok {
			return false
		}
		s.Fields[key] = &vals[i] // a later entry for the same key replaces it, as in proto
	}
	return true
}

// flatEntry decodes one map<string, Value> entry holding its key and its
// value at most once each (a missing key is "", a missing value an empty
// Value, as in proto).
func (d *decoder) flatEntry(b []byte, v *structpb.Value) (string, bool) {
	var key string
	var haveKey, haveValue bool
	for len(b) > 0 {
		f, rest := next(b)
		b = rest
		ok := false
		switch {
		case f.num == 1 && f.isBytes() && !haveKey:
			haveKey = true
			key, ok = d.string(f.s)
		case f.num == 2 && f.isBytes() && !haveValue:
			haveValue = true
			ok = d.flatValue(f.s, v)
		}
		if !ok {
			return "", false
		}
	}
	return key, true
}

// flatValue decodes a Value with at most one field, a scalar kind.
func (d *decoder) flatValue(b []byte, v *structpb.Value) bool {
	if len(b) == 0 {
		return true
	}
	f, rest := next(b)
	if len(rest) != 0 {
		return false
	}
	switch {
	case f.num == 1 && f.isVarint(): // an open enum, truncated to int32 as in proto
		v.Kind = &structpb.Value_NullValue{NullValue: structpb.NullValue(int32(f.v))}
	case f.num == 2 && f.typ == protowire.Fixed64Type:
		v.Kind = &structpb.Value_NumberValue{NumberValue: math.Float64frombits(f.v)}
	case f.num == 3 && f.isBytes():
		str, ok := d.string(f.s)
		if !ok {
			return false
		}
		if len(d.strKinds) == 0 {
			// room for the string values among this Struct's entries yet
			// to decode: one allocation instead of one per value
			d.strKinds = make([]structpb.Value_StringValue, max(d.strLeft, 1))
		}
		k := &d.strKinds[0]
		d.strKinds = d.strKinds[1:]
		k.StringValue = str
		v.Kind = k
	case f.num == 4 && f.isVarint():
		v.Kind = &structpb.Value_BoolValue{BoolValue: f.v != 0}
	default:
		return false
	}
	return true
}

package extprocwire

import (
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The guard against a go-control-plane upgrade. The codec names the fields
// of ProcessingRequest and ProcessingResponse it knows, field number by
// field number; an upgrade that adds a field to either message, or to one
// they hold, would otherwise go unnoticed: the decoder would hand every
// message carrying it to proto (correct, but no longer the fast path), and
// the encoder would leave it out of what it writes, silently. These tests
// build, from the messages' descriptors (protoreflect), one message per
// field path with that field alone set, and fail for any field the codec
// does not name, so the upgrade's diff shows which fields to add.

// leftToProto are the field paths the codec leaves to proto on purpose,
// with why.
var leftToProto = map[string]string{
	// Sent by no client the server has (Envoy, grpc-go); the whole response
	// then goes to proto.Marshal.
	"ProcessingResponse.typed_dynamic_metadata":      "not sent by the server",
	"ProcessingResponse.streamed_immediate_response": "not sent by the server",
}

// fieldSample is a message with one field path set.
type fieldSample struct {
	path string
	msg  proto.Message
}

// fieldSamples returns, for every field of root's message and of the
// messages it holds (to maxDepth, not into google.protobuf types, whose
// encoding is proto's own), a message with that field alone set on the
// path to it.
func fieldSamples(root proto.Message, maxDepth int) []fieldSample {
	var out []fieldSample
	rootName := string(root.ProtoReflect().Descriptor().Name())
	var walk func(path []protoreflect.FieldDescriptor, md protoreflect.MessageDescriptor)
	walk = func(path []protoreflect.FieldDescriptor, md protoreflect.MessageDescriptor) {
		fields := md.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			p := append(path[:len(path):len(path)], fd)
			names := []string{rootName}
			for _, f := range p {
				names = append(names, string(f.Name()))
			}
			out = append(out, fieldSample{path: strings.Join(names, "."), msg: withPath(root, p)})
			if fd.Message() != nil && !fd.IsMap() && len(p) < maxDepth &&
				!strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.") {
				walk(p, fd.Message())
			}
		}
	}
	walk(nil, root.ProtoReflect().Descriptor())
	return out
}

// withPath returns a new message of root's type with the fields of path
// set: each message on the way present (a list or map with one element),
// the last field a non-zero sample value.
func withPath(root proto.Message, path []protoreflect.FieldDescriptor) proto.Message {
	m := root.ProtoReflect().Type().New()
	cur := m
	for _, fd := range path {
		switch {
		case fd.IsMap():
			mp := cur.Mutable(fd).Map()
			key := sampleValue(fd.MapKey()).MapKey()
			if fd.MapValue().Message() != nil {
				mp.Mutable(key)
			} else {
				mp.Set(key, sampleValue(fd.MapValue()))
			}
		case fd.IsList():
			l := cur.Mutable(fd).List()
			if fd.Message() == nil {
				l.Append(sampleValue(fd))
				continue
			}
			e := l.NewElement()
			l.Append(e)
			cur = e.Message()
		case fd.Message() != nil:
			cur = cur.Mutable(fd).Message()
		default:
			cur.Set(fd, sampleValue(fd))
		}
	}
	return m.Interface()
}

// sampleValue is a non-zero value of fd's scalar kind.
func sampleValue(fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(1.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(1.5)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("x")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("x"))
	}
	panic("no sample for kind " + fd.Kind().String())
}

// leftToProtoPath reports a path at or under one leftToProto names.
func leftToProtoPath(path string) bool {
	for p := range leftToProto {
		if path == p || strings.HasPrefix(path, p+".") {
			return true
		}
	}
	return false
}

// TestEncoderNamesEveryResponseField: the fast encoder writes every field of
// a ProcessingResponse and of the messages it holds, so that what it writes
// reads back equal, or it declines a field listed in leftToProto.
func TestEncoderNamesEveryResponseField(t *testing.T) {
	samples := fieldSamples(&extprocv3.ProcessingResponse{}, 6)
	if len(samples) < 50 {
		t.Fatalf("only %d field paths: the descriptor walk is broken", len(samples))
	}
	for _, s := range samples {
		m := s.msg.(*extprocv3.ProcessingResponse)
		var e encoder
		n, ok := e.response(m)
		if !ok {
			if !leftToProtoPath(s.path) {
				t.Errorf("%s: the fast encoder does not name it (write it, or list it in leftToProto)", s.path)
			}
			continue
		}
		b, err := e.appendResponse(make([]byte, 0, n), m)
		if err != nil {
			t.Errorf("%s: %v", s.path, err)
			continue
		}
		got := &extprocv3.ProcessingResponse{}
		if err := proto.Unmarshal(b, got); err != nil || !proto.Equal(got, m) || len(b) != n {
			t.Errorf("%s: the fast encoder drops or changes it: %v, read back %v (%d bytes, sized %d)", s.path, err, got, len(b), n)
		}
	}
}

// TestDecoderNamesEveryRequestField: the fast decoder reads every field of
// a ProcessingRequest and of the messages it holds, equal to
// proto.Unmarshal, without handing the message to proto.
func TestDecoderNamesEveryRequestField(t *testing.T) {
	samples := fieldSamples(&extprocv3.ProcessingRequest{}, 6)
	if len(samples) < 30 {
		t.Fatalf("only %d field paths: the descriptor walk is broken", len(samples))
	}
	for _, s := range samples {
		b, err := proto.Marshal(s.msg)
		if err != nil {
			t.Fatalf("%s: %v", s.path, err)
		}
		got := &extprocv3.ProcessingRequest{}
		d := decoder{own: b}
		if !d.request(b, got) {
			if !leftToProtoPath(s.path) {
				t.Errorf("%s: the fast decoder does not name it (read it, or list it in leftToProto)", s.path)
			}
			continue
		}
		if !proto.Equal(got, s.msg) {
			t.Errorf("%s: the fast decoder reads %v, want %v", s.path, got, s.msg)
		}
	}
}

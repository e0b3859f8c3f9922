package extprocwire

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// The body family: HttpBody read from a request, BodyMutation and
// StreamedBodyResponse written in a response. Field numbers as in
// request.go and response.go.

func body(b []byte, hb *extprocv3.HttpBody) bool {
	for len(b) > 0 {
		f, rest := next(b)
		b = rest
		switch {
		case f.num == 1 && f.isBytes():
			hb.Body = bytesField(f.s)
		case f.num == 2 && f.isVarint():
			hb.EndOfStream = f.v != 0
		case f.num == 3 && f.isVarint():
			hb.EndOfStreamWithoutMessage = f.v != 0
		case f.num == 4 && f.isVarint():
			hb.GrpcMessageCompressed = f.v != 0
		case f.num == 5 && f.isVarint():
			hb.DrainComplete = f.v != 0
		default:
			return false
		}
	}
	return true
}

// bodyMutation sizes a BodyMutation. Its members are a oneof, so a set
// member is written even when empty or false (it has presence).
func (e *encoder) bodyMutation(num protowire.Number, bm *extprocv3.BodyMutation) (int, bool) {
	if !plain(bm) {
		return 0, false
	}
	slot := e.open()
	n := 0
	switch m := bm.Mutation.(type) {
	case nil:
	case *extprocv3.BodyMutation_Body:
		n = protowire.SizeTag(1) + protowire.SizeBytes(len(m.Body))
	case *extprocv3.BodyMutation_ClearBody:
		n = protowire.SizeTag(2) + 1
	case *extprocv3.BodyMutation_StreamedResponse:
		s, ok := e.streamedBody(3, m.StreamedResponse)
		if !ok {
			return 0, false
		}
		n = s
	default:
		return 0, false
	}
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendBodyMutation(b []byte, num protowire.Number, bm *extprocv3.BodyMutation) []byte {
	b = e.head(b, num)
	switch m := bm.Mutation.(type) {
	case *extprocv3.BodyMutation_Body:
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m.Body)
	case *extprocv3.BodyMutation_ClearBody:
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, boolean(m.ClearBody))
	case *extprocv3.BodyMutation_StreamedResponse:
		b = e.appendStreamedBody(b, 3, m.StreamedResponse)
	}
	return b
}

func (e *encoder) streamedBody(num protowire.Number, s *extprocv3.StreamedBodyResponse) (int, bool) {
	if s == nil || !plain(s) {
		return 0, false
	}
	slot := e.open()
	n := sizeBytes(1, len(s.Body)) + sizeVarint(2, boolean(s.EndOfStream)) +
		sizeVarint(3, boolean(s.EndOfStreamWithoutMessage)) + sizeVarint(4, boolean(s.GrpcMessageCompressed)) +
		sizeVarint(5, boolean(s.DrainComplete))
	return e.closeMsg(slot, num, n), true
}

func (e *encoder) appendStreamedBody(b []byte, num protowire.Number, s *extprocv3.StreamedBodyResponse) []byte {
	b = e.head(b, num)
	b = appendBytes(b, 1, s.Body)
	b = appendVarint(b, 2, boolean(s.EndOfStream))
	b = appendVarint(b, 3, boolean(s.EndOfStreamWithoutMessage))
	b = appendVarint(b, 4, boolean(s.GrpcMessageCompressed))
	return appendVarint(b, 5, boolean(s.DrainComplete))
}

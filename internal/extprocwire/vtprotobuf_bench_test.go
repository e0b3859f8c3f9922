//go:build vtprotobuf

package extprocwire

import (
	"fmt"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// vtMessage is what go-control-plane's generated vtprotobuf code gives a
// message under the vtprotobuf build tag (its *_vtproto.pb.go files,
// generated with the marshal_strict feature only: no MarshalVT, no
// UnmarshalVT).
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(dAtA []byte) (int, error)
}

// vtMarshal is Codec.Marshal with the generated code in place of the
// hand-written encoder, as a codec would call it: the same buffer choice
// (a plain slice below mem.IsBelowBufferPoolingThreshold, else a pooled
// one) and the message found by a type assertion, as a build without the
// tag would need. MarshalToSizedBufferVTStrict writes from the end of a
// slice exactly SizeVT long.
func vtMarshal(m *extprocv3.ProcessingResponse) (mem.BufferSlice, error) {
	vt, ok := any(m).(vtMessage)
	if !ok {
		return nil, fmt.Errorf("%T has no vtprotobuf marshaler", m)
	}
	n := vt.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(n) {
		b := make([]byte, n)
		if _, err := vt.MarshalToSizedBufferVTStrict(b); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(n)
	if _, err := vt.MarshalToSizedBufferVTStrict((*buf)[:n]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// BenchmarkMarshalVT compares the hand-written encoder (Codec.Marshal)
// with go-control-plane's vtprotobuf code (vtMarshal) on the responses
// BenchmarkMarshal encodes. The two alternate inside each run, in blocks
// of vtBlock calls, so that both see the same share of this shared
// machine; each run reports the CPU time per call of each (getrusage,
// garbage collection included), their ratio, and each one's allocations.
//
//	go test -tags vtprotobuf -run '^$' -bench MarshalVT -count 10 ./internal/extprocwire
func BenchmarkMarshalVT(b *testing.B) {
	const vtBlock = 1024
	hand := NewCodec()
	for _, c := range marshalCases() {
		b.Run(c.name, func(b *testing.B) {
			ops := [2]func() (mem.BufferSlice, error){
				func() (mem.BufferSlice, error) { return hand.Marshal(c.m) },
				func() (mem.BufferSlice, error) { return vtMarshal(c.m) },
			}
			// Both write what proto.Marshal would, read back equal at the
			// same length. The bytes may differ in field order: the
			// hand-written encoder writes a oneof after the other fields, as
			// proto.Marshal does (response.go), the Strict code by field
			// number.
			for i, op := range ops {
				data, err := op()
				if err != nil {
					b.Fatal(err)
				}
				wire := data.Materialize()
				data.Free()
				got := new(extprocv3.ProcessingResponse)
				if err := proto.Unmarshal(wire, got); err != nil || !proto.Equal(got, c.m) || len(wire) != proto.Size(c.m) {
					b.Fatalf("encoder %d: %d bytes (proto.Size %d) read back as %v, %v", i, len(wire), proto.Size(c.m), got, err)
				}
			}
			var allocs [2]float64
			for i, op := range ops {
				allocs[i] = testing.AllocsPerRun(100, func() {
					data, _ := op()
					data.Free()
				})
			}

			var cpu [2]time.Duration
			var calls [2]int
			turn, inBlock := 0, 0
			b.ReportAllocs()
			start := cpuTime(b)
			for b.Loop() {
				data, err := ops[turn]()
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
				calls[turn]++
				if inBlock++; inBlock == vtBlock {
					now := cpuTime(b)
					cpu[turn] += now - start
					start, inBlock, turn = now, 0, 1-turn
				}
			}
			cpu[turn] += cpuTime(b) - start
			// A run too short for both to have a block (-benchtime=1x, the
			// smoke test) reports no CPU figures rather than a zero.
			if calls[0] >= vtBlock && calls[1] >= vtBlock {
				hand := float64(cpu[0]) / float64(calls[0])
				vt := float64(cpu[1]) / float64(calls[1])
				b.ReportMetric(hand, "hand-cpu-ns/op")
				b.ReportMetric(vt, "vt-cpu-ns/op")
				b.ReportMetric(vt/hand, "vt/hand")
			}
			b.ReportMetric(allocs[0], "hand-allocs/op")
			b.ReportMetric(allocs[1], "vt-allocs/op")
		})
	}
}

package compress

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
)

// benchModes are the codecs measured: auto, zstd and s2 with the built-in
// dictionary, and auto with a dictionary trained on the class (zstd).
var benchModes = []string{"auto", "zstd", "s2", "trained"}

// BenchmarkCompress is the CPU a first write spends compressing its
// answer, and BenchmarkExpand what a replay spends expanding it, per
// class of the generated corpus and mode (benchModes).
// stored-bytes/op is the stored frame's length.
func BenchmarkCompress(b *testing.B) {
	for _, c := range corpus.Classes {
		answers := corpus.New(1).Answers(c, 64)
		for _, mode := range benchModes {
			b.Run(string(c)+"/"+mode, func(b *testing.B) {
				codec := benchCodec(b, c, mode)
				var out, in int
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					r := answers[i%len(answers)]
					in += idem.ContentsSize(&r)
					out += len(codec.Compress(r).Body)
				}
				b.ReportMetric(float64(out)/float64(b.N), "stored-bytes/op")
				b.ReportMetric(float64(in)/float64(b.N), "contents-bytes/op")
			})
		}
	}
}

func BenchmarkExpand(b *testing.B) {
	for _, c := range corpus.Classes {
		for _, mode := range benchModes {
			b.Run(string(c)+"/"+mode, func(b *testing.B) {
				codec := benchCodec(b, c, mode)
				var frames []idem.Response
				for _, r := range corpus.New(1).Answers(c, 64) {
					frames = append(frames, codec.Compress(r))
				}
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if _, err := codec.Expand(frames[i%len(frames)], 1<<20); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func benchCodec(b *testing.B, c corpus.Class, mode string) *Codec {
	switch mode {
	case "trained":
		return newCodec(b, Options{Dictionary: trainedDict(b, c, 40000)})
	case "zstd":
		return newCodec(b, Options{Mode: Zstd})
	case "s2":
		return newCodec(b, Options{Mode: S2})
	}
	return newCodec(b, Options{})
}

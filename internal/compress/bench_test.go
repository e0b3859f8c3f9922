package compress

import (
	"testing"

	"github.com/klauspost/compress/s2"

	"github.com/idem-extproc/idem-extproc/internal/corpus"
	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// BenchmarkCompress is the CPU a first write spends compressing its
// answer, and BenchmarkExpand what a replay spends expanding it, per
// class of the generated corpus, with the built-in dictionary and with
// one trained on the class. bytes/op is the stored frame's length.
func BenchmarkCompress(b *testing.B) {
	for _, c := range corpus.Classes {
		answers := corpus.New(1).Answers(c, 64)
		for _, mode := range []string{"builtin", "trained"} {
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
		for _, mode := range []string{"builtin", "trained"} {
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
	if mode == "trained" {
		return newCodec(b, Options{Dictionary: trainedDict(b, c, 40000)})
	}
	return newCodec(b, Options{})
}

// BenchmarkS2Alternative is the codec compression was chosen against: S2
// (github.com/klauspost/compress/s2) on the same contents, without a
// dictionary and with the built-in dictionary's words as its dictionary.
// stored-bytes/op compares with BenchmarkCompress's (docs/performance.md,
// "Memory per stored answer", why zstd).
func BenchmarkS2Alternative(b *testing.B) {
	words := []byte(builtinVocabulary)
	dict := s2.MakeDict(words, nil)
	if dict == nil {
		b.Fatal("the built-in words do not make an S2 dictionary")
	}
	for _, c := range corpus.Classes {
		var plains [][]byte
		for _, r := range corpus.New(1).Answers(c, 64) {
			plains = append(plains, idem.AppendContents(nil, &r))
		}
		for _, mode := range []string{"plain", "builtin-words"} {
			b.Run(string(c)+"/"+mode, func(b *testing.B) {
				dst := make([]byte, 0, s2.MaxEncodedLen(corpus.MaxBody+4096))
				var out int
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if mode == "plain" {
						out += len(s2.Encode(dst[:0], plains[i%len(plains)]))
					} else {
						out += len(dict.Encode(dst[:0], plains[i%len(plains)]))
					}
				}
				b.ReportMetric(float64(out)/float64(b.N), "stored-bytes/op")
			})
		}
	}
}

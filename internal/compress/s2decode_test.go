package compress

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/s2"

	"github.com/idem-extproc/idem-extproc/internal/corpus"
	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// FuzzDecodeS2Dict: decodeS2Dict opens every block s2.Dict.Decode opens,
// to the same bytes, and refuses every block it refuses, whatever the
// block holds; the seeds are blocks S2 made of each class of the corpus,
// of runs (its repeat codes), and the built-in words' own bytes, whole
// and cut short.
func FuzzDecodeS2Dict(f *testing.F) {
	c := newCodec(f, Options{Mode: S2})
	plains := [][]byte{
		[]byte(`{"id":"` + strings.Repeat("x", 1015) + `"}`),
		[]byte(strings.Repeat("ab", 40000)),
		[]byte(builtinVocabulary),
		{},
	}
	for _, cl := range corpus.Measured {
		r := corpus.New(5).Answer(cl)
		plains = append(plains, idem.AppendContents(nil, &r))
	}
	for _, p := range plains {
		block := c.words.Encode(nil, p)
		f.Add(block)
		f.Add(block[:len(block)/2])
		f.Add(append(slices.Clone(block), 0))
	}
	f.Fuzz(func(t *testing.T, block []byte) {
		if n, err := s2.DecodedLen(block); err == nil && n > 1<<20 {
			return // both would allocate what it says first: not the point here
		}
		want, wantErr := c.words.Decode(nil, block)
		got, gotErr := decodeWithParts(c, block)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("s2.Dict.Decode: %v; decodeS2Dict: %v", wantErr, gotErr)
		}
		if wantErr == nil && !bytes.Equal(got, want) {
			t.Fatalf("decoded %d bytes, s2.Dict.Decode %d, and they differ", len(got), len(want))
		}
	})
}

// decodeWithParts decodes block as expandS2 does, with the limit its
// own decoded length.
func decodeWithParts(c *Codec, block []byte) ([]byte, error) {
	n, err := s2.DecodedLen(block)
	if err != nil {
		return nil, err
	}
	return c.expandS2(block, n)
}

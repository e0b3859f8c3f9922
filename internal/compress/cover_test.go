package compress

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/klauspost/compress/dict"
	"github.com/klauspost/compress/zstd"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
)

func contents(c corpus.Class, seed uint64, n int) [][]byte {
	var out [][]byte
	for _, r := range corpus.New(seed).Answers(c, n) {
		out = append(out, idem.AppendContents(nil, &r))
	}
	return out
}

// TestTrainedDictionaryCompresses: a dictionary Train makes from 500
// answers of a class is at most the size asked, names its id, and takes
// answers of another seed to at most 0.25 of their contents for objects
// and 0.3 for another API's orders (about 0.22 and 0.24 measured), and to
// at most 0.8 of what github.com/klauspost/compress/dict's builder, which
// Train used before, makes of them (about 0.72 and 0.73).
func TestTrainedDictionaryCompresses(t *testing.T) {
	for _, tc := range []struct {
		class     corpus.Class
		maxRatio  float64
		maxVsDict float64
	}{
		{corpus.Object, 0.25, 0.8},
		{corpus.Order, 0.3, 0.8},
	} {
		samples := contents(tc.class, 1000, 500)
		raw, err := Train(samples, 40000, 16<<10)
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) > 16<<10 {
			t.Errorf("%s: dictionary of %d bytes, asked for at most %d", tc.class, len(raw), 16<<10)
		}
		d, err := ParseDictionary("trained", raw)
		if err != nil || d.ID() != 40000 {
			t.Fatalf("%s: %v, id %v", tc.class, err, d)
		}
		before, err := dict.BuildZstdDict(samples, dict.Options{MaxDictSize: 16 << 10, HashBytes: 8, ZstdDictID: 40000,
			ZstdLevel: zstd.SpeedFastest})
		if err != nil {
			t.Fatal(err)
		}
		measured := contents(tc.class, 1, 300)
		plain := 0
		for _, s := range measured {
			plain += len(s)
		}
		old, err := ParseDictionary("dict builder", before)
		if err != nil {
			t.Fatal(err)
		}
		ours, err := compressedSize(d, measured)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := compressedSize(old, measured)
		if err != nil {
			t.Fatal(err)
		}
		ratio, vsDict := float64(ours)/float64(plain), float64(ours)/float64(theirs)
		t.Logf("%s: %.3f of the contents; %.3f of the dict builder's frames", tc.class, ratio, vsDict)
		if ratio > tc.maxRatio || vsDict > tc.maxVsDict {
			t.Errorf("%s: %.3f of the contents (want <= %.2f), %.3f of the dict builder's (want <= %.2f)",
				tc.class, ratio, tc.maxRatio, vsDict, tc.maxVsDict)
		}
	}
}

// TestCoverContent: COVER's content is at most the size asked, made of
// the samples' own bytes, puts the string every sample shares in it, and
// is the same from one run to the next; samples with nothing worth
// keeping give nothing.
func TestCoverContent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	shared := `"shipping_address":{"country":"PT","postal_code":`
	var samples [][]byte
	for range 200 {
		noise := make([]byte, 64)
		for i := range noise {
			noise[i] = byte('a' + rng.IntN(26))
		}
		samples = append(samples, []byte(string(noise)+shared+string(noise[:16])))
	}
	for _, d := range coverDs {
		for _, k := range coverKs {
			p := coverParams{k: k, d: d}
			content := coverContent(samples, 1024, p)
			if len(content) == 0 || len(content) > 1024 {
				t.Fatalf("%+v: %d bytes of content, want 1 to 1024", p, len(content))
			}
			if !bytes.Contains(content[len(content)-256:], []byte(shared[8:40])) {
				t.Errorf("%+v: the shared string is not near the end of the content: %q", p, content)
			}
			if again := coverContent(samples, 1024, p); !bytes.Equal(again, content) {
				t.Errorf("%+v: two runs chose different content", p)
			}
		}
	}
	if c := coverContent([][]byte{[]byte("short")}, 1024, coverDefault); c != nil {
		t.Errorf("five bytes gave %q", c)
	}
	tiny := make([][]byte, 8)
	for i := range tiny {
		tiny[i] = []byte{byte(i)}
	}
	if _, err := Train(tiny, 40000, 4096); err == nil || !strings.Contains(err.Error(), "repeat too little") {
		t.Errorf("eight one-byte samples: %v", err)
	}
}

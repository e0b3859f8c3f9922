package compress

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
)

var update = flag.Bool("update", false, "write the testdata/builtin-object*.frame fixtures that are missing (never rewrite one: records in stores are like it)")

func newCodec(t testing.TB, o Options) *Codec {
	t.Helper()
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func same(a, b idem.Response) bool {
	return a.Status == b.Status && a.BodyOmitted == b.BodyOmitted && bytes.Equal(a.Body, b.Body) &&
		slices.Equal(a.Headers, b.Headers)
}

// trainedDict trains a dictionary on up to 300 answers of class c, and no
// more than 1 MiB of them (a few dozen lists): enough for the round trips
// and benchmarks that use it, in a fraction of the time under -race.
//
// A class and id's dictionary is trained once per test binary and parsed
// anew for each caller: training is deterministic, and BenchmarkCompress
// and BenchmarkExpand ask for the same four.
func trainedDict(t testing.TB, c corpus.Class, id uint32) *Dictionary {
	t.Helper()
	trainedMu.Lock()
	defer trainedMu.Unlock()
	key := trainedKey{c, id}
	raw, ok := trained[key]
	if !ok {
		raw = train(t, c, id)
		trained[key] = raw
	}
	d, err := ParseDictionary("test", raw)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type trainedKey struct {
	class corpus.Class
	id    uint32
}

var (
	trainedMu sync.Mutex
	trained   = map[trainedKey][]byte{}
)

func train(t testing.TB, c corpus.Class, id uint32) []byte {
	t.Helper()
	var samples [][]byte
	total := 0
	for _, r := range corpus.New(uint64(id)).Answers(c, 300) {
		s := idem.AppendContents(nil, &r)
		if total += len(s); total > 1<<20 && len(samples) >= 32 {
			break
		}
		samples = append(samples, s)
	}
	raw, err := Train(samples, id, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestRoundTrip: every class of answer, in every mode, with the built-in
// dictionary and a trained one, expands to the very status, headers and
// body it was, and each mode makes the frames it says: auto an S2 block
// below AutoZstdFrom (unless it retries with zstd: TestAutoRetriesWithZstd)
// and a zstd frame from there on (with a trained dictionary, always zstd),
// zstd and s2 theirs. Every codec expands every other's frames: a record
// outlives a change of mode.
func TestRoundTrip(t *testing.T) {
	for _, c := range corpus.Measured {
		t.Run(string(c), func(t *testing.T) {
			trained := trainedDict(t, c, 50000)
			codecs := map[string]*Codec{
				"auto":         newCodec(t, Options{}),
				"zstd":         newCodec(t, Options{Mode: Zstd}),
				"s2":           newCodec(t, Options{Mode: S2}),
				"auto trained": newCodec(t, Options{Dictionary: trained}),
				"zstd trained": newCodec(t, Options{Mode: Zstd, Dictionary: trained}),
			}
			reader := newCodec(t, Options{Mode: Off, Dictionary: trained})
			for name, codec := range codecs {
				for _, want := range corpus.New(1).Answers(c, 50) {
					z := codec.Compress(want)
					if !z.Compressed || z.Status != want.Status || len(z.Headers) != 0 {
						t.Fatalf("%s: %d bytes not compressed: %+v", name, idem.ContentsSize(&want), z)
					}
					n := idem.ContentsSize(&want)
					wantFormat := byte(formatZstdBare)
					if name == "s2" || (name == "auto" && n < AutoZstdFrom) {
						wantFormat = formatS2Builtin
					}
					retries := name == "auto" && n < AutoZstdFrom &&
						len(codecs["s2"].Compress(want).Body)*autoRetryDen > n*autoRetryNum
					if z.Body[0] != wantFormat && !retries {
						t.Fatalf("%s: %d bytes of contents made format %d, want %d", name, n, z.Body[0], wantFormat)
					}
					if z.Body[0] == formatZstdBare && [4]byte(z.Body[1:5]) == zstdMagic {
						t.Fatalf("%s: a new zstd frame starts with its magic number", name)
					}
					if got, err := reader.Expand(z, corpus.MaxBody+4096); err != nil || !same(got, want) {
						t.Fatalf("%s: a codec of mode off did not expand it: %v", name, err)
					}
					got, err := codec.Expand(z, corpus.MaxBody+4096)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if !same(got, want) {
						t.Fatalf("%s: expanded %+v\nwant %+v", name, got, want)
					}
				}
			}
		})
	}
}

// TestAutoRetriesWithZstd: below AutoZstdFrom, auto keeps the S2 block of
// an answer S2 compresses well, and of one whose block keeps more than
// autoRetryNum/autoRetryDen of its contents it keeps the smaller of that
// block and the zstd frame. On the corpus, no object retries and nearly
// every order of another API's style (corpus.Order) does, to records a
// fifth smaller than S2's.
func TestAutoRetriesWithZstd(t *testing.T) {
	auto, s2Only, zstdOnly := newCodec(t, Options{}), newCodec(t, Options{Mode: S2}), newCodec(t, Options{Mode: Zstd})
	const answers = 200
	for _, tc := range []struct {
		class      corpus.Class
		minRetried int
		maxRetried int
	}{
		{corpus.Object, 0, 0},
		{corpus.Order, answers * 9 / 10, answers},
	} {
		var retried, autoBytes, s2Bytes int
		for _, r := range corpus.New(2).Answers(tc.class, answers) {
			n := idem.ContentsSize(&r)
			a, s, z := auto.Compress(r).Body, s2Only.Compress(r).Body, zstdOnly.Compress(r).Body
			want := s
			if len(s)*autoRetryDen > n*autoRetryNum {
				retried++
				if len(z) < len(s) {
					want = z
				}
			}
			if !bytes.Equal(a, want) {
				t.Fatalf("%s: auto made %d bytes (format %d), want %d (S2 %d, zstd %d, contents %d)",
					tc.class, len(a), a[0], len(want), len(s), len(z), n)
			}
			autoBytes += len(a)
			s2Bytes += len(s)
		}
		t.Logf("%s: %d of %d retried with zstd; auto's frames %.3f of S2's", tc.class, retried, answers,
			float64(autoBytes)/float64(s2Bytes))
		if retried < tc.minRetried || retried > tc.maxRetried {
			t.Errorf("%s: %d of %d answers retried with zstd, want %d to %d", tc.class, retried, answers,
				tc.minRetried, tc.maxRetried)
		}
	}
}

// TestCompressLeavesAlone what compressing cannot or need not touch.
func TestCompressLeavesAlone(t *testing.T) {
	c := newCodec(t, Options{})
	big := corpus.New(1).Answer(corpus.Object)
	for name, r := range map[string]idem.Response{
		"small":      {Status: 201, Body: []byte(`{"id":"1"}`), Headers: []idem.Header{{Name: "content-type", Value: "application/json"}}},
		"empty":      {Status: 204},
		"omitted":    {Status: 200, Headers: big.Headers, BodyOmitted: true},
		"sealed":     {Status: 200, Body: big.Body, Sealed: true},
		"compressed": {Status: 200, Body: big.Body, Compressed: true},
		// Random bytes do not compress: the frame would be larger.
		"incompressible": {Status: 200, Body: randomBytes(4096)},
	} {
		if got := c.Compress(r); !same(got, r) || got.Compressed != r.Compressed || got.Sealed != r.Sealed {
			t.Errorf("%s: Compress changed it to %+v", name, got)
		}
	}
	var off *Codec
	if got := off.Compress(big); got.Compressed {
		t.Error("a nil codec compressed")
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

// TestLargeIncompressibleAnswersAreTriedOnASample: a large answer zstd
// cannot shrink is kept as it came after encoding a sample of it, not
// laid out and encoded whole. Before, a 1 MiB one allocated about 4 MiB
// on its way to being kept uncompressed. A large answer that compresses
// only past its start is kept uncompressed too; one that compresses from
// its start still is.
func TestLargeIncompressibleAnswersAreTriedOnASample(t *testing.T) {
	for _, mode := range []Mode{Auto, Zstd, S2} {
		c := newCodec(t, Options{Mode: mode})
		for range 2 * runtime.GOMAXPROCS(0) { // every one of the encoder's coders made, the pools filled
			c.Compress(idem.Response{Status: 200, Body: randomBytes(sampleFrom)})
		}
		r := idem.Response{Status: 200, Body: randomBytes(1 << 20)}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		got := c.Compress(r)
		runtime.ReadMemStats(&after)
		if !same(got, r) || got.Compressed {
			t.Errorf("%v: a 1 MiB incompressible answer became %+v", mode, got)
		}
		if a := after.TotalAlloc - before.TotalAlloc; a > 64<<10 {
			t.Errorf("%v: keeping a 1 MiB incompressible answer allocated %d bytes, want at most 64 KiB", mode, a)
		}
		text := bytes.Repeat([]byte(`{"id":"ord_1","status":"created"},`), (1<<20)/34)
		if got := c.Compress(idem.Response{Status: 200, Body: text}); !got.Compressed {
			t.Errorf("%v: a 1 MiB answer of repeated JSON was not compressed", mode)
		}
		mixed := append(randomBytes(sampleBytes), text...)
		if got := c.Compress(idem.Response{Status: 200, Body: mixed}); got.Compressed {
			t.Errorf("%v: an answer incompressible at its start was compressed", mode)
		}
	}
}

// TestExpandRefuses frames it must not replay.
func TestExpandRefuses(t *testing.T) {
	trainedCodec := newCodec(t, Options{Dictionary: trainedDict(t, corpus.Object, 50001)})
	builtin := newCodec(t, Options{Mode: Zstd})
	r := corpus.New(2).Answer(corpus.Object)
	z := trainedCodec.Compress(r)
	zb := builtin.Compress(r)
	sb := newCodec(t, Options{Mode: S2}).Compress(r)
	if sb.Body[0] != formatS2Builtin {
		t.Fatalf("mode s2 made format %d", sb.Body[0])
	}
	// An S2 block that says it expands to more than it does.
	longer := slices.Concat([]byte{formatS2Builtin}, binary.AppendUvarint(nil, uint64(idem.ContentsSize(&r))+100),
		sb.Body[1+uvarintLen(sb.Body[1:]):])
	for name, tc := range map[string]struct {
		codec *Codec
		r     idem.Response
		max   int
		want  string
	}{
		"unknown dictionary": {builtin, z, 1 << 20, "needs dictionary 50001"},
		"past the limit":     {builtin, zb, 100, "exceeds the limit of 100"},
		"unknown format":     {builtin, idem.Response{Status: 200, Body: append([]byte{9}, zb.Body[1:]...), Compressed: true}, 1 << 20, "unknown format"},
		"empty":              {builtin, idem.Response{Status: 200, Compressed: true}, 1 << 20, "unknown format"},
		"truncated":          {builtin, idem.Response{Status: 200, Body: zb.Body[:len(zb.Body)-9], Compressed: true}, 1 << 20, ""},
		"still sealed":       {builtin, idem.Response{Status: 200, Body: zb.Body, Compressed: true, Sealed: true}, 1 << 20, "still sealed"},
		"s2 past the limit":  {builtin, sb, 100, "exceeds the limit of 100"},
		"s2 truncated":       {builtin, idem.Response{Status: 200, Body: sb.Body[:len(sb.Body)-9], Compressed: true}, 1 << 20, ""},
		"s2 length wrong":    {builtin, idem.Response{Status: 200, Body: longer, Compressed: true}, 1 << 20, ""},
		"s2 no length":       {builtin, idem.Response{Status: 200, Body: []byte{formatS2Builtin}, Compressed: true}, 1 << 20, ""},
		"no codec":           {nil, zb, 1 << 20, "compression is off"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tc.codec.Expand(tc.r, tc.max)
			if !errors.Is(err, ErrExpand) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Expand = %v, want ErrExpand with %q", err, tc.want)
			}
		})
	}
	// An uncompressed response passes through.
	if got, err := builtin.Expand(r, 10); err != nil || !same(got, r) {
		t.Fatalf("uncompressed: %v", err)
	}
}

// TestExpandS2DeclaredLengthIsCapped: an S2 block that declares a
// length past the limit, here 1 GiB in a few bytes, is refused before
// anything of that length is allocated (s2.Dict.Decode would allocate
// what the block declares).
func TestExpandS2DeclaredLengthIsCapped(t *testing.T) {
	c := newCodec(t, Options{Mode: S2})
	body := slices.Concat([]byte{formatS2Builtin}, binary.AppendUvarint(nil, 1<<30), []byte{0, 'x'})
	r := idem.Response{Status: 200, Body: body, Compressed: true}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 8 {
		if _, err := c.Expand(r, 1<<20); !errors.Is(err, ErrExpand) ||
			!strings.Contains(err.Error(), "exceeds the limit of 1048576") {
			t.Fatalf("Expand = %v, want ErrExpand past the limit", err)
		}
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("refusing 8 blocks allocated %d bytes", grew)
	}
}

// TestBuiltinDictionaryIsFixed: records in a store name the built-in
// dictionary by its id, so its bytes can never change under that id; a
// frame compressed with it when it was made (a whole frame, format 1, as
// the first compressed records were written) keeps expanding.
func TestBuiltinDictionaryIsFixed(t *testing.T) {
	sum := sha256.Sum256([]byte(builtinVocabulary))
	const want = "67bbffdd5e267c537b52674f374a79a4ee51815531f3976c668f8bbe49893abe"
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("built-in dictionary %d changed: sha256 %s, was %s; a new vocabulary needs a new id, "+
			"the old one kept for reading", BuiltinID, got, want)
	}
	r := corpus.New(7).Answer(corpus.Object)
	// An S2 block's dictionary is the same words (format 3).
	for fixture, mode := range map[string]Mode{
		"testdata/builtin-object.frame":    Zstd,
		"testdata/builtin-object-s2.frame": S2,
	} {
		c := newCodec(t, Options{Mode: mode})
		if _, err := os.Stat(fixture); *update && errors.Is(err, os.ErrNotExist) {
			if err := os.WriteFile(fixture, c.Compress(r).Body, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		frame, err := os.ReadFile(fixture)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Expand(idem.Response{Status: r.Status, Body: frame, Compressed: true}, 1<<20)
		if err != nil || !same(got, r) {
			t.Fatalf("%s: %v\n%+v", fixture, err, got)
		}
	}
}

func uvarintLen(b []byte) int {
	_, n := binary.Uvarint(b)
	return n
}

// TestDictionaryMistakes: what ParseDictionary and New refuse.
func TestDictionaryMistakes(t *testing.T) {
	d := trainedDict(t, corpus.Error, 50002)
	if _, err := ParseDictionary("plain.txt", []byte("just some text, not a dictionary")); err == nil ||
		!strings.Contains(err.Error(), "plain.txt: not a zstd dictionary") {
		t.Errorf("text: %v", err)
	}
	low := slices.Clone(d.raw)
	low[4], low[5], low[6], low[7] = 5, 0, 0, 0 // id 5: a reserved one
	if _, err := ParseDictionary("low", low); err == nil || !strings.Contains(err.Error(), "id 5 is outside") {
		t.Errorf("low id: %v", err)
	}
	other := trainedDict(t, corpus.Object, 50002)
	other.source = "other"
	if _, err := New(Options{Dictionary: d, Previous: []*Dictionary{other}}); err == nil ||
		!strings.Contains(err.Error(), "same id 50002") {
		t.Errorf("same id: %v", err)
	}
	if _, err := New(Options{Mode: S2, Dictionary: d}); err == nil ||
		!strings.Contains(err.Error(), "S2 cannot use") {
		t.Errorf("s2 with a trained dictionary: %v", err)
	}
	if _, err := New(Options{Mode: Off + 1}); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Errorf("unknown mode: %v", err)
	}
	if _, err := Train([][]byte{[]byte("a")}, 50003, 4096); err == nil {
		t.Error("one sample trained a dictionary")
	}
	if _, err := Train(nil, 7, 4096); err == nil {
		t.Error("id 7 trained a dictionary")
	}
}

// FuzzExpand: whatever a stored body holds (a record changed in the
// store, a format this server does not know), expanding it gives the
// response or ErrExpand, never a panic, and never more than the limit.
func FuzzExpand(f *testing.F) {
	r := corpus.New(3).Answer(corpus.Object)
	for _, m := range []Mode{Zstd, S2} {
		f.Add(newCodec(f, Options{Mode: m}).Compress(r).Body)
	}
	f.Add([]byte{formatS2Builtin, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{formatZstdBare})
	c := newCodec(f, Options{})
	const limit = 64 << 10
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := c.Expand(idem.Response{Status: 200, Body: body, Compressed: true}, limit)
		if err != nil {
			if !errors.Is(err, ErrExpand) {
				t.Fatalf("error %v is not ErrExpand", err)
			}
			return
		}
		if idem.ContentsSize(&got) > limit+len(got.Headers)*2*binary.MaxVarintLen64 {
			t.Fatalf("expanded to %d bytes past the limit", idem.ContentsSize(&got))
		}
	})
}

package attempt

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/seal"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
)

func codec(t *testing.T, o compress.Options) *compress.Codec {
	t.Helper()
	c, err := compress.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// keyRing is a real seal ring of one key.
func keyRing(t *testing.T) *seal.Ring {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	k := base64.StdEncoding.EncodeToString(slices.Repeat([]byte{7}, 32))
	if err := os.WriteFile(path, []byte("k1 "+k+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := seal.LoadRing(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// stored is what the store holds of the decider's record.
func (d *decider) stored(t *testing.T) *idem.Response {
	t.Helper()
	rec, err := d.store.Get(context.Background(), d.attempt(d.conv).ID)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Response
}

// TestCompressedReplayIsByteIdentical: a first write stores its answer
// compressed (sealed after, when the policy encrypts), and a retry gets
// back exactly the status, headers and body the upstream sent.
func TestCompressedReplayIsByteIdentical(t *testing.T) {
	ctx := context.Background()
	want := corpus.New(3).Answer(corpus.Object)
	for _, encrypt := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "sealed"}[encrypt], func(t *testing.T) {
			pol := policy.Default()
			pol.Encrypt = encrypt
			pol.Compression.Codec = codec(t, compress.Options{})
			d := newDecider(t, pol)
			if encrypt {
				d.srv.Sealer = keyRing(t)
			}
			d.first(t, fp1).settleStored(ctx, want)
			st := d.stored(t)
			if !st.Compressed || st.Sealed != encrypt || len(st.Headers) != 0 {
				t.Fatalf("stored compressed=%v sealed=%v headers=%d", st.Compressed, st.Sealed, len(st.Headers))
			}
			if !encrypt && len(st.Body) >= idem.ContentsSize(&want)*3/4 {
				t.Fatalf("stored %d bytes for %d of headers and body", len(st.Body), idem.ContentsSize(&want))
			}
			res, err := d.attempt(d.conv).decide(ctx, fp1)
			if err != nil || res.Outcome != idem.Completed {
				t.Fatalf("replay: %v %v", res.Outcome, err)
			}
			got := res.Response
			if got.Compressed || got.Sealed || got.Status != want.Status || string(got.Body) != string(want.Body) ||
				!slices.Equal(got.Headers, want.Headers) {
				t.Fatalf("replayed %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestRecordsWrittenUncompressedStillReplay: a record stored before
// compression (or by a policy with compression off) replays as it is.
func TestRecordsWrittenUncompressedStillReplay(t *testing.T) {
	ctx := context.Background()
	want := corpus.New(4).Answer(corpus.Object)
	pol := policy.Default()
	pol.Compression.Codec = nil
	d := newDecider(t, pol)
	d.first(t, fp1).settleStored(ctx, want) // no codec: stored as it came
	if d.stored(t).Compressed {
		t.Fatal("stored compressed without a codec")
	}
	pol.Compression.Codec = codec(t, compress.Options{})
	res, err := d.attempt(d.conv).decide(ctx, fp1)
	if err != nil || string(res.Response.Body) != string(want.Body) || !slices.Equal(res.Response.Headers, want.Headers) {
		t.Fatalf("replay %+v %v", res.Response, err)
	}
}

// TestDictionaryRotation: records compressed with a trained dictionary
// replay after a rotation while the old dictionary is kept for reading,
// and are refused (never replayed as stored, never run again) once it is
// dropped.
func TestDictionaryRotation(t *testing.T) {
	ctx := context.Background()
	d1, d2 := trained(t, 40001), trained(t, 40002)
	want := corpus.New(5).Answer(corpus.Object)
	pol := policy.Default()
	pol.Compression.Codec = codec(t, compress.Options{Dictionary: d1})
	d := newDecider(t, pol)
	d.first(t, fp1).settleStored(ctx, want)

	pol.Compression.Codec = codec(t, compress.Options{Dictionary: d2, Previous: []*compress.Dictionary{d1}})
	res, err := d.attempt(d.conv).decide(ctx, fp1)
	if err != nil || string(res.Response.Body) != string(want.Body) {
		t.Fatalf("after rotation: %v", err)
	}

	pol.Compression.Codec = codec(t, compress.Options{Dictionary: d2})
	_, err = d.attempt(d.conv).decide(ctx, fp1)
	if !errors.Is(err, compress.ErrExpand) || unreachable(err) {
		t.Fatalf("dictionary dropped: err %v, unreachable %v", err, unreachable(err))
	}
}

func trained(t *testing.T, id uint32) *compress.Dictionary {
	t.Helper()
	var samples [][]byte
	for _, r := range corpus.New(uint64(id)).Answers(corpus.Object, 200) {
		samples = append(samples, idem.AppendContents(nil, &r))
	}
	raw, err := compress.Train(samples, id, 8<<10)
	if err != nil {
		t.Fatal(err)
	}
	dict, err := compress.ParseDictionary("trained", raw)
	if err != nil {
		t.Fatal(err)
	}
	return dict
}

package e2e

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// TestCompressedAnswersReplayByteIdentical: answers of every class of the
// generated corpus, from 230 bytes to 60 KiB, go through Envoy's
// ext_proc conversation and Redis compressed (the default policy: S2
// blocks, zstd frames of the lists and of the orders S2 finds little to
// repeat in), and a retry gets back the very status, headers and body of
// the first answer; the upstream ran each operation once.
func TestCompressedAnswersReplayByteIdentical(t *testing.T) {
	gen := corpus.New(21)
	var answers []idem.Response
	for _, c := range corpus.Measured {
		answers = append(answers, gen.Answers(c, 3)...)
	}
	var effects atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, err := strconv.Atoi(r.Header.Get("x-answer"))
		if err != nil || i < 0 || i >= len(answers) {
			http.Error(w, "no such answer", http.StatusBadRequest)
			return
		}
		effects.Add(1)
		a := answers[i]
		for _, h := range a.Headers {
			w.Header().Add(h.Name, h.Value)
		}
		w.WriteHeader(a.Status)
		_, _ = w.Write(a.Body)
	})
	env := harness.Start(t, harness.Options{UpstreamHandler: handler})
	formats := map[string]int{}
	for i, want := range answers {
		key := "answer-" + strconv.Itoa(i)
		first := env.Post("/v1/payment_intents", key, `{"amount":1999}`, "x-answer", strconv.Itoa(i))
		again := env.Post("/v1/payment_intents", key, `{"amount":1999}`, "x-answer", strconv.Itoa(i))
		if first.Err != nil || again.Err != nil {
			t.Fatalf("answer %d: %v / %v", i, first.Err, again.Err)
		}
		if again.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("answer %d: the retry was not a replay: %d %v", i, again.Status, again.Header)
		}
		if again.Status != want.Status || again.Body != string(want.Body) || first.Body != string(want.Body) {
			t.Fatalf("answer %d (%d bytes): replayed %d with %d bytes, want %d", i, len(want.Body), again.Status, len(again.Body), want.Status)
		}
		for _, h := range want.Headers {
			if got := again.Header.Values(h.Name); !slices.Contains(got, h.Value) {
				t.Fatalf("answer %d: replayed %s %q, want %q", i, h.Name, got, h.Value)
			}
		}
		rec, err := env.Store.Get(context.Background(), idem.RecordIDFor("default", strings.TrimPrefix(env.URL, "http://"), key))
		if err != nil {
			t.Fatal(err)
		}
		formats[string(rec.Response.Body[:1])]++
		if !rec.Response.Compressed || len(rec.Response.Body) >= len(want.Body) {
			t.Fatalf("answer %d: stored compressed=%v, %d bytes for a %d-byte body", i, rec.Response.Compressed,
				len(rec.Response.Body), len(want.Body))
		}
	}
	if n := effects.Load(); int(n) != len(answers) {
		t.Fatalf("the upstream ran %d operations for %d keys", n, len(answers))
	}
	// Both kinds of frame went through: format 2 (zstd), format 3 (S2).
	if formats["\x02"] == 0 || formats["\x03"] == 0 {
		t.Fatalf("stored frames by format byte: %v, want zstd (2) and S2 (3) frames", formats)
	}
}

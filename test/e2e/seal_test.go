package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/seal"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

func newRing(t *testing.T, kid string) (*seal.Ring, string) {
	t.Helper()
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(kid+" "+base64.StdEncoding.EncodeToString(b)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := seal.LoadRing(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return r, path
}

// TestStoredResponsesAreSealed: with encrypt on, Redis holds no byte of
// the response's headers or body; replays are byte-identical; a flipped
// byte is answered as a store error and never replayed.
func TestStoredResponsesAreSealed(t *testing.T) {
	ring, _ := newRing(t, "k-2026")
	env := harness.Start(t, harness.Options{Sealer: ring, Policies: policies(t, "defaults:\n  encrypt: true\n")})
	secret := `{"card":"4111111111111111","owner":"Ada Lovelace"}`
	first := env.Post("/payments", "sealed-1", secret)
	wantStatus(t, first, http.StatusCreated)
	wantReplayOf(t, env.Post("/payments", "sealed-1", secret), first)

	rdb := env.Redis.Client()
	ctx := context.Background()
	keys, _ := rdb.Keys(ctx, "idem:*").Result()
	if len(keys) != 1 {
		t.Fatalf("records %v", keys)
	}
	// A completed record is one string; the sealed envelope ends it.
	rec, err := rdb.Get(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{"4111111111111111", "Ada Lovelace", "/orders/", "application/json", "second"} {
		if strings.Contains(rec, leak) {
			t.Fatalf("the record holds %q in the clear", leak)
		}
	}

	// Tamper with the stored envelope.
	at := int64(len(rec) - 3)
	if err := rdb.SetRange(ctx, keys[0], at, string([]byte{rec[at] ^ 0x01})).Err(); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, env.Post("/payments", "sealed-1", secret), problem.StoreUnavailable)
	if n := env.Upstream.CountKey("sealed-1"); n != 1 {
		t.Fatalf("a tampered record must not let the operation run again (effects %d)", n)
	}
}

// TestWrongKeyRingRefusesReplay: a server whose ring lacks the record's
// key answers 503 rather than replaying or re-executing.
func TestWrongKeyRingRefusesReplay(t *testing.T) {
	ringA, _ := newRing(t, "a")
	ringB, _ := newRing(t, "b")
	env := harness.Start(t, harness.Options{Sealer: ringA, Policies: policies(t, "defaults:\n  encrypt: true\n")})
	wantStatus(t, env.Post("/payments", "k", `{}`), http.StatusCreated)
	other := harness.Start(t, harness.Options{Sealer: ringB, Store: harness.OnRedis(env.Redis), Policies: policies(t, "defaults:\n  encrypt: true\n")})
	// Same Redis, same authority is not guaranteed: ask under env's host.
	host := strings.TrimPrefix(env.URL, "http://")
	wantProblem(t, other.Post("/payments", "k", `{}`, "Host", host), problem.StoreUnavailable)
	if n := other.Upstream.CountKey("k"); n != 0 {
		t.Fatalf("effects on the second server = %d, want 0", n)
	}
}

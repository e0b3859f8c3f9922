package idemclient

import (
	"net/http"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// FuzzQuoteKey: every key SetKey accepts reaches the server as itself: the
// server's parser reads the quoted form back to the same key.
func FuzzQuoteKey(f *testing.F) {
	for _, k := range []string{"order-42", `a"b`, `a\b`, `"`, `\`, "0190f6b4-5c3e-7d1a-9b2f-3e4d5c6b7a8f"} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		r, _ := http.NewRequest(http.MethodPost, "http://x/", nil)
		if err := SetKey(r, key); err != nil {
			return
		}
		got, err := idem.ParseKey(r.Header.Get(KeyHeader), 0)
		if err != nil || got != key || Key(r) != key {
			t.Fatalf("key %q sent as %q, read back %q (%v)", key, r.Header.Get(KeyHeader), got, err)
		}
	})
}

// FuzzRetryAfter: any Retry-After value gives a wait between 0 and a day.
func FuzzRetryAfter(f *testing.F) {
	for _, v := range []string{"1", "0", "-5", "99999999999999999999", "Wed, 21 Oct 2015 07:28:00 GMT", "soon", ""} {
		f.Add(v)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{}
		h.Set("Retry-After", v)
		if d := retryAfter(h, now); d < 0 || d > 24*time.Hour {
			t.Fatalf("Retry-After %q gave %v", v, d)
		}
	})
}

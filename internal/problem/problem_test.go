package problem

import (
	"encoding/json"
	"testing"
	"time"
)

func TestBodyIsRFC9457(t *testing.T) {
	p := New(InProgress, `a "quoted" detail`)
	var got map[string]any
	if err := json.Unmarshal(p.Body(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type":   TypeBase + "request-in-progress",
		"title":  InProgress.Title,
		"status": float64(409),
		"detail": `a "quoted" detail`,
	}
	if len(got) != len(want) {
		t.Fatalf("members %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

func TestRetryAfterHeader(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                       "",
		time.Second:             "1",
		1500 * time.Millisecond: "2", // never earlier than asked
		time.Millisecond:        "1",
		90 * time.Second:        "90",
	} {
		p := &Problem{Kind: InProgress, RetryAfter: d}
		if got := p.RetryAfterHeader(); got != want {
			t.Errorf("RetryAfter %v: header %q, want %q", d, got, want)
		}
	}
}

func TestKindsAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range []Kind{KeyMissing, KeyInvalid, KeyReused, InProgress, OutcomeUnknown,
		StoreUnavailable, BodyTooLarge, BodyIncomplete, PrincipalMissing, CapacityExceeded, BodyUnreadable,
		HomeOutOfReach, HomesDisagree} {
		if seen[k.Slug] || k.Title == "" || k.Status < 400 || k.Status > 599 {
			t.Errorf("bad kind %+v", k)
		}
		seen[k.Slug] = true
	}
}

package attempt

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// redisRecords is a decider over a real redis-server, with the raw string
// of its record at hand.
type redisRecords struct {
	*decider
	redis *redistest.Server
	key   string
}

func newRedisRecords(t *testing.T, pol *policy.Policy) *redisRecords {
	t.Helper()
	rs := redistest.Start(t, redistest.Options{})
	st := redistest.OpenStore(t, rs.URL(), time.Second)
	d := newDecider(t, pol)
	d.store, d.srv.Store = st, st
	return &redisRecords{decider: d, redis: rs, key: st.Key(d.attempt(d.conv).ID)}
}

// raw is the record's string as Redis holds it.
func (r *redisRecords) raw(t *testing.T) string {
	t.Helper()
	v, err := r.redis.Do(context.Background(), "GET", r.key).Text()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// put replaces the record's string with v.
func (r *redisRecords) put(t *testing.T, v string) {
	t.Helper()
	if err := r.redis.Do(context.Background(), "SET", r.key, v).Err(); err != nil {
		t.Fatal(err)
	}
}

// refused checks that a retry of fp1 is answered 503
// idempotency-store-unavailable and counted as a record that cannot be
// used, whatever the policy's failure mode.
func (r *redisRecords) refused(t *testing.T, what string) {
	t.Helper()
	for _, mode := range []policy.FailureMode{policy.FailClosed, policy.FailOpen} {
		r.pol.FailureMode = mode
		c := &conv{}
		v := r.attempt(c).request(context.Background(), fp1)
		if v.Kind != answered || v.Problem == nil || v.Problem.Kind != problem.StoreUnavailable {
			t.Fatalf("%s (%v): verdict %+v, want 503 %s", what, mode, v, problem.StoreUnavailable.Slug)
		}
		if got := c.decisions; !slices.Equal(got, []idem.Decision{idem.DecisionRecordUnusable}) {
			t.Fatalf("%s (%v): decisions %v, want %v", what, mode, got, idem.DecisionRecordUnusable)
		}
	}
	r.pol.FailureMode = policy.FailClosed
}

// flagsAt is the offset of the flags byte in a completed record of the
// sized layout whose status is 200 to 16383 (a two-byte uvarint).
const flagsAt = 63 + 2

// whole gives the sized record v the length it has, at offset 59, as
// whoever can write to Redis and knows the layout would: what refuses it
// then is not its shape.
func whole(v []byte) string {
	binary.BigEndian.PutUint32(v[59:63], uint32(len(v)))
	return string(v)
}

// TestUnsealedRecordUnderEncryptionIsRefused: under a policy that
// encrypts, a record whose sealed flag was cleared (its envelope then
// read as a body in the clear) is never replayed: whoever can write to
// Redis must not choose the answer.
func TestUnsealedRecordUnderEncryptionIsRefused(t *testing.T) {
	pol := policy.Default()
	pol.Encrypt = true
	r := newRedisRecords(t, pol)
	r.srv.Sealer = keyRing(t)
	r.first(t, fp1).settleStored(context.Background(), corpus.New(5).Answer(corpus.Object))
	v := []byte(r.raw(t))
	if v[flagsAt]&2 == 0 {
		t.Fatalf("flags %08b: not sealed", v[flagsAt])
	}
	v[flagsAt] &^= 2
	r.put(t, whole(v))
	r.refused(t, "sealed flag cleared")

	// A forged record in the clear, compressed or not.
	forged := func(flags byte) string {
		f := append(v[:flagsAt:flagsAt], flags)
		return whole(append(f, "\x00forged"...))
	}
	for _, flags := range []byte{4, 0} {
		r.put(t, forged(flags))
		r.refused(t, fmt.Sprintf("forged in the clear, flags %08b", flags))
	}
	// The same forgery, uncompressed, replays under a policy that does not
	// encrypt: encryption is what refused it.
	r.pol.Encrypt = false
	res, err := r.attempt(r.conv).decide(context.Background(), fp1)
	if err != nil || res.Outcome != idem.Completed || string(res.Response.Body) != "forged" {
		t.Fatalf("forged record without encryption: %v %v", res.Outcome, err)
	}
}

// TestEncryptionSwitchedOnRefusesClearRecords: records a policy stored in
// the clear are refused once the policy encrypts (docs/design.md §6.8:
// nothing in a record tells a clear one written before the switch from
// one forged after it), and the keys used after the switch replay.
func TestEncryptionSwitchedOnRefusesClearRecords(t *testing.T) {
	ctx := context.Background()
	for _, body := range []string{"ok", string(corpus.New(6).Answer(corpus.Object).Body)} {
		t.Run(fmt.Sprint(len(body)), func(t *testing.T) {
			pol := policy.Default()
			r := newRedisRecords(t, pol)
			want := idem.Response{Status: 201, Headers: []idem.Header{{Name: "content-type", Value: "application/json"}}, Body: []byte(body)}
			r.first(t, fp1).settleStored(ctx, want)
			if res, err := r.attempt(r.conv).decide(ctx, fp1); err != nil || res.Outcome != idem.Completed {
				t.Fatalf("replay before the switch: %v %v", res.Outcome, err)
			}

			pol.Encrypt = true
			r.srv.Sealer = keyRing(t)
			r.refused(t, "written before encryption")

			// Purged (as the admin API does), the key is used again: its
			// new record is sealed and replays.
			if err := r.redis.Do(ctx, "DEL", r.key).Err(); err != nil {
				t.Fatal(err)
			}
			r.first(t, fp1).settleStored(ctx, want)
			if st := r.stored(t); !st.Sealed {
				t.Fatal("stored in the clear after the switch")
			}
			res, err := r.attempt(r.conv).decide(ctx, fp1)
			if err != nil || res.Outcome != idem.Completed || string(res.Response.Body) != body {
				t.Fatalf("replay after the switch: %v %v", res.Outcome, err)
			}
		})
	}
}

// TestDamagedRecordsAre503: a completed record cut at any length (inside
// its body too, where a record in the clear would otherwise replay a
// shorter body as the whole one), emptied, grown by bytes appended, or
// replaced by a value of another Redis type is never replayed and never
// answered with a claim about the client's request (422
// idempotency-key-reused): 503, under either failure mode.
func TestDamagedRecordsAre503(t *testing.T) {
	ctx := context.Background()
	small := idem.Response{Status: 201, Headers: []idem.Header{{Name: "content-type", Value: "text/plain"}, {Name: "x-id", Value: "7"}}, Body: []byte("created")}
	for _, tc := range []struct {
		name    string
		encrypt bool
		resp    idem.Response
	}{
		{"sealed", true, corpus.New(7).Answer(corpus.Object)},
		{"compressed", false, corpus.New(7).Answer(corpus.Object)},
		{"plain", false, small},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := policy.Default()
			pol.Encrypt = tc.encrypt
			r := newRedisRecords(t, pol)
			if tc.encrypt {
				r.srv.Sealer = keyRing(t)
			}
			r.first(t, fp1).settleStored(ctx, tc.resp)
			whole := r.raw(t)
			for n := range len(whole) {
				r.put(t, whole[:n])
				r.refused(t, fmt.Sprintf("cut to %d of %d bytes", n, len(whole)))
			}
			for _, tail := range []string{"\x00", "x", whole[len(whole)-1:], whole} {
				r.put(t, whole+tail)
				r.refused(t, fmt.Sprintf("%d bytes appended", len(tail)))
			}
			r.put(t, whole)
			if res, err := r.attempt(r.conv).decide(ctx, fp1); err != nil || res.Outcome != idem.Completed {
				t.Fatalf("whole record: %v %v", res.Outcome, err)
			}
		})
	}
	t.Run("wrong type", func(t *testing.T) {
		r := newRedisRecords(t, policy.Default())
		for _, cmd := range [][]any{
			{"RPUSH", r.key, "x"},
			{"SADD", r.key, "x"},
			{"ZADD", r.key, 1, "x"},
			{"XADD", r.key, "*", "f", "v"},
			{"HSET", r.key, "s", "z", "f", string(fp1[:])}, // a state no script writes
			{"HSET", r.key, "s", "i", "f", "short"},        // a fingerprint cut short
		} {
			if err := r.redis.Do(ctx, "DEL", r.key).Err(); err != nil {
				t.Fatal(err)
			}
			if err := r.redis.Do(ctx, cmd...).Err(); err != nil {
				t.Fatal(err)
			}
			r.refused(t, fmt.Sprint(cmd[0]))
		}
	})
}

// TestDamagedRecordAfterAWaitIs503: a duplicate that waited for the
// attempt in flight and then finds the record damaged is answered 503,
// not 409 request-in-progress as if the first attempt still ran.
func TestDamagedRecordAfterAWaitIs503(t *testing.T) {
	ctx := context.Background()
	pol := policy.Default()
	pol.WaitForInFlight = 200 * time.Millisecond
	r := newRedisRecords(t, pol)
	r.first(t, fp1)
	c := &conv{}
	dup := r.attempt(c)
	if v := dup.request(ctx, fp1); v.Kind != Wait {
		t.Fatalf("duplicate: verdict %+v, want Wait", v)
	}
	r.put(t, "x")
	v := dup.Await(ctx)
	if v.Kind != answered || v.Problem == nil || v.Problem.Kind != problem.StoreUnavailable {
		t.Fatalf("verdict %+v, want 503 %s", v, problem.StoreUnavailable.Slug)
	}
	if got := c.decisions; !slices.Equal(got, []idem.Decision{idem.DecisionRecordUnusable}) {
		t.Fatalf("decisions %v, want %v", got, idem.DecisionRecordUnusable)
	}
}

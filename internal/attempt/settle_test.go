package attempt

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// reporter records what an attempt reports.
type reporter struct {
	mu        sync.Mutex
	decisions []idem.Decision
}

func (r *reporter) Decided(_ string, d idem.Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decisions = append(r.decisions, d)
}

func (r *reporter) Background() context.Context { return context.Background() }

// observer counts settle failures; the rest of idem.Observer does nothing.
type observer struct {
	idem.NopObserver
	settleFailed []string
}

func (o *observer) SettleFailed(_, op string) { o.settleFailed = append(o.settleFailed, op) }

// flaky fails the first n final transitions as an unreachable store would.
type flaky struct {
	idem.Store
	n int
}

var errDown = errors.New("store down")

func (f *flaky) fail() error {
	if f.n > 0 {
		f.n--
		return errDown
	}
	return nil
}

func (f *flaky) Complete(ctx context.Context, id idem.RecordID, tok idem.Token, resp idem.Response, ret time.Duration) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Store.Complete(ctx, id, tok, resp, ret)
}

func (f *flaky) MarkUnknown(ctx context.Context, id idem.RecordID, tok idem.Token, ret time.Duration) error {
	if err := f.fail(); err != nil {
		return err
	}
	return f.Store.MarkUnknown(ctx, id, tok, ret)
}

// fixture is one reserved attempt on an in-memory store.
type fixture struct {
	store idem.Store
	att   Attempt
	rep   *reporter
	obs   *observer
}

// held reserves a record under pol and makes a hold it; wrap, when set,
// puts a store between the attempt and the in-memory one.
func held(t *testing.T, pol *policy.Policy, wrap func(idem.Store) idem.Store) *fixture {
	t.Helper()
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	var st idem.Store = ms
	if wrap != nil {
		st = wrap(ms)
	}
	f := &fixture{store: ms, rep: &reporter{}, obs: &observer{}}
	srv := &Server{Store: st, Observer: f.obs, Log: slog.New(slog.DiscardHandler),
		StoreTimeout: time.Second, SettleAtEndTimeout: time.Second}
	f.att = New(srv, f.rep)
	f.att.Policy = pol
	f.att.admit("tenant", false, "key-1")
	f.att.token = idem.NewToken()
	res, err := ms.Reserve(context.Background(), idem.Reservation{ID: f.att.ID, Fingerprint: idem.Fingerprint{1},
		Token: f.att.token, Lease: pol.Lease, Retention: pol.Retention})
	if err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("reserve: %v %v", res.Outcome, err)
	}
	f.att.reserved()
	t.Cleanup(func() { stopRenewing(&f.att) })
	return f
}

// state reads the record's state; 0 when there is none.
func (f *fixture) state(t *testing.T) idem.State {
	t.Helper()
	rec, err := f.store.Get(context.Background(), f.att.ID)
	if errors.Is(err, idem.ErrNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

// TestResponseDecisionTable is docs/design.md §4's table of the default
// response rules, played on an attempt that holds its record: each row's
// response settles the record as the table says.
func TestResponseDecisionTable(t *testing.T) {
	const released idem.State = 0
	for _, tc := range []struct {
		name     string
		origin   idem.Origin
		status   int
		retried  bool
		want     idem.State
		decision idem.Decision
	}{
		{"upstream 201", idem.OriginUpstream, 201, false, idem.StateCompleted, idem.DecisionStored},
		{"upstream 500 is stored", idem.OriginUpstream, 500, false, idem.StateCompleted, idem.DecisionStored},
		{"upstream 408", idem.OriginUpstream, 408, false, released, idem.DecisionReleased},
		{"upstream 425", idem.OriginUpstream, 425, false, released, idem.DecisionReleased},
		{"upstream 429", idem.OriginUpstream, 429, false, released, idem.DecisionReleased},
		{"not sent 503", idem.OriginNotSent, 503, false, released, idem.DecisionReleased},
		{"maybe sent 504", idem.OriginMaybeSent, 504, false, idem.StateUnknown, idem.DecisionMarkedUnknown},
		{"status not a number", idem.OriginUpstream, 0, false, idem.StateUnknown, idem.DecisionMarkedUnknown},
		// After a router retry the last attempt's answer proves nothing
		// about the earlier ones: nothing is released.
		{"upstream 429 after a retry", idem.OriginUpstream, 429, true, idem.StateUnknown, idem.DecisionMarkedUnknown},
		{"upstream 201 after a retry is stored", idem.OriginUpstream, 201, true, idem.StateCompleted, idem.DecisionStored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := held(t, policy.Default(), nil)
			ctx := context.Background()
			if a := f.att.actionFor(tc.origin, tc.status, tc.retried); a == idem.ActionStore {
				f.att.settleStored(ctx, idem.Response{Status: tc.status})
			} else {
				f.att.settle(ctx, a)
			}
			if got := f.state(t); got != tc.want {
				t.Fatalf("record state %v, want %v", got, tc.want)
			}
			if f.att.renew != nil || f.att.retry != nil {
				t.Fatal("the attempt still holds the record")
			}
			if len(f.rep.decisions) != 1 || f.rep.decisions[0] != tc.decision {
				t.Fatalf("decisions %v, want [%s]", f.rep.decisions, tc.decision)
			}
		})
	}
}

// TestEndOfStreamTable is §4's table of how a stream that ends with the
// record still held settles it.
func TestEndOfStreamTable(t *testing.T) {
	releasing := policy.Default()
	releasing.OnStreamReset = idem.ActionRelease
	partial := &idem.Response{Status: 201, BodyOmitted: true}
	for _, tc := range []struct {
		name    string
		pol     *policy.Policy
		partial *idem.Response
		want    idem.State
	}{
		{"before any response: on_stream_reset unknown", policy.Default(), nil, idem.StateUnknown},
		{"before any response: on_stream_reset release", releasing, nil, 0},
		{"after stored headers: completed without body", policy.Default(), partial, idem.StateCompleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := held(t, tc.pol, nil)
			f.att.SettleAtEnd(context.Background(), tc.partial)
			if got := f.state(t); got != tc.want {
				t.Fatalf("record state %v, want %v", got, tc.want)
			}
			if tc.partial != nil {
				rec, _ := f.store.Get(context.Background(), f.att.ID)
				if rec.Response == nil || !rec.Response.BodyOmitted || rec.Response.Status != 201 {
					t.Fatalf("stored %+v", rec.Response)
				}
			}
		})
	}
}

// TestRefusedSettlementRetriedAtEnd: a final transition the store refuses
// is not lost: End tries it again and reports the decision once it lands;
// one that never lands is reported as a settle failure.
func TestRefusedSettlementRetriedAtEnd(t *testing.T) {
	t.Run("lands on retry", func(t *testing.T) {
		fl := &flaky{n: 1}
		f := held(t, policy.Default(), func(st idem.Store) idem.Store { fl.Store = st; return fl })
		f.att.settleStored(context.Background(), idem.Response{Status: 201})
		if f.state(t) != idem.StateInFlight || f.att.renew == nil && f.att.retry == nil || len(f.rep.decisions) != 0 {
			t.Fatalf("after a refused complete: state %v, pending %v, decisions %v", f.state(t), f.att.renew != nil || f.att.retry != nil, f.rep.decisions)
		}
		f.att.SettleAtEnd(context.Background(), nil)
		if f.state(t) != idem.StateCompleted || len(f.rep.decisions) != 1 || f.rep.decisions[0] != idem.DecisionStored {
			t.Fatalf("after End: state %v, decisions %v", f.state(t), f.rep.decisions)
		}
	})
	t.Run("never lands", func(t *testing.T) {
		fl := &flaky{n: 1 << 30}
		f := held(t, policy.Default(), func(st idem.Store) idem.Store { fl.Store = st; return fl })
		f.att.srv.SettleAtEndTimeout = 50 * time.Millisecond // the retry's whole budget, not a wait
		f.att.settle(context.Background(), idem.ActionUnknown)
		f.att.SettleAtEnd(context.Background(), nil)
		if f.state(t) != idem.StateInFlight || len(f.rep.decisions) != 0 ||
			len(f.obs.settleFailed) != 1 || f.obs.settleFailed[0] != string(idem.DecisionMarkedUnknown) {
			t.Fatalf("state %v, decisions %v, settle failures %v", f.state(t), f.rep.decisions, f.obs.settleFailed)
		}
	})
}

// TestSettleWithoutHoldIsNothing: an attempt that holds no record (a
// duplicate, a shadow duplicate) never settles one.
func TestSettleWithoutHoldIsNothing(t *testing.T) {
	f := held(t, policy.Default(), nil)
	other := New(f.att.srv, f.rep)
	other.Policy, other.ID, other.token = f.att.Policy, f.att.ID, idem.NewToken()
	other.settleStored(context.Background(), idem.Response{Status: 201})
	other.settle(context.Background(), idem.ActionRelease)
	other.SettleAtEnd(context.Background(), nil)
	if f.state(t) != idem.StateInFlight || len(f.rep.decisions) != 0 {
		t.Fatalf("state %v, decisions %v", f.state(t), f.rep.decisions)
	}
}

// TestSettleCall: under a policy that answers JSON-RPC, the transport's
// refusal of a call, answered by the upstream, releases the record; the same answer from Envoy under a rule
// that stores it, and the call's own answer, complete it.
func TestSettleCall(t *testing.T) {
	refusal := idem.Response{Status: 404, Headers: []idem.Header{{Name: "content-type", Value: "text/plain"}}, Body: []byte("session not found")}
	answer := idem.Response{Status: 200, Headers: []idem.Header{{Name: "content-type", Value: "application/json"}},
		Body: []byte(`{"jsonrpc":"2.0","id":3,"result":{}}`)}
	for _, tc := range []struct {
		name    string
		origin  idem.Origin
		retried bool
		rs      idem.Response
		want    idem.State
		d       idem.Decision
	}{
		{"upstream refusal", idem.OriginUpstream, false, refusal, 0, idem.DecisionReleased},
		{"Envoy's 404, stored by a rule", idem.OriginNotSent, false, refusal, idem.StateCompleted, idem.DecisionStored},
		{"the call's answer", idem.OriginUpstream, false, answer, idem.StateCompleted, idem.DecisionStored},
		// A router retry's last attempt refused: an earlier one may have
		// run the call.
		{"upstream refusal after a retry", idem.OriginUpstream, true, refusal, idem.StateUnknown, idem.DecisionMarkedUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := policy.Default()
			pol.Answers = policy.AnswersJSONRPC
			f := held(t, pol, nil)
			f.att.callID = []byte(`3`)
			f.att.actionFor(tc.origin, tc.rs.Status, tc.retried)
			f.att.settleStored(context.Background(), tc.rs)
			if got := f.state(t); got != tc.want || f.att.renew != nil {
				t.Fatalf("state %v (held %v), want %v", got, f.att.renew != nil, tc.want)
			}
			if len(f.rep.decisions) != 1 || f.rep.decisions[0] != tc.d {
				t.Fatalf("decisions %v, want %v", f.rep.decisions, tc.d)
			}
		})
	}
}

// stopRenewing ends a's lease renewal if it still holds the record, as a
// test's cleanup: the store it renews in closes with the test.
func stopRenewing(a *Attempt) {
	if a.renew != nil {
		a.renew.stop()
		a.renew = nil
	}
}

// TestSettlementIsOneLine: a response's settlement is one log line that
// also says how the response was judged (its origin and what the protocol
// side read), whether the response settles at its headers or is stored at
// its end; no other line is written for it.
func TestSettlementIsOneLine(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		outcome idem.Decision
	}{
		{"stored at its end", 201, idem.DecisionStored},
		{"released at its headers", 429, idem.DecisionReleased},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			d := newDecider(t, policy.Default())
			d.srv.Log = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			a := d.first(t, fp1)
			logs.Reset()
			ctx := context.Background()
			r := Response{Origin: idem.OriginUpstream, Status: tc.status}
			if v := a.AtResponse(ctx, r, slog.Int("status", tc.status)); v.Kind == Store {
				r.End, r.Read = true, idem.Response{Status: tc.status}
				a.AtResponse(ctx, r, slog.String("read", "end"))
			}
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if len(lines) != 1 {
				t.Fatalf("%d lines, want 1:\n%s", len(lines), logs.String())
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
				t.Fatal(err)
			}
			if m["msg"] != "settled" || m["outcome"] != string(tc.outcome) || m["origin"] != "upstream" || m["status"] != float64(tc.status) {
				t.Fatalf("line %s", lines[0])
			}
		})
	}
}

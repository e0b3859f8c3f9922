package attempt

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// farHome places every key in one store with a budget of its own.
type farHome struct {
	st     idem.Store
	budget time.Duration
}

func (f farHome) StoreFor(*policy.Policy, string, string) (idem.Store, time.Duration) {
	return f.st, f.budget
}

// TestFarHome: a policy whose scope's home is a far store has every call
// of the attempt made on that store, and its request-time verdict first
// asks the proxy for the calls' time (a Wait), then decides; a store that
// answers that the key moved elsewhere fails the decision rather than
// letting the request run on a store that does not arbitrate it.
func TestFarHome(t *testing.T) {
	local, far := memstore.New(memstore.Options{}), memstore.New(memstore.Options{})
	srv := &Server{Store: local, Homes: farHome{far, 450 * time.Millisecond}, Observer: idem.NopObserver{},
		Log: slog.New(slog.DiscardHandler), StoreTimeout: 100 * time.Millisecond, SettleAtEndTimeout: time.Second}
	p := policy.Default()
	p.Homes = &policy.Homes{Epoch: 1, Default: "far"}
	ctx := context.Background()

	a := New(srv, &reporter{})
	a.Policy = p
	if prob := a.Admit("scope", "k1"); prob != nil {
		t.Fatal(prob)
	}
	v := a.Request(ctx, idem.Fingerprint{1})
	if v.Kind != Wait || v.Wait != 900*time.Millisecond {
		t.Fatalf("first verdict %+v, want a wait of two far budgets", v)
	}
	if v = a.Await(ctx); v.Kind != Continue {
		t.Fatalf("after the wait %+v, want continue (reserved)", v)
	}
	if _, err := far.Get(ctx, a.ID); err != nil {
		t.Fatalf("the record is not in the far store: %v", err)
	}
	if _, err := local.Get(ctx, a.ID); err == nil {
		t.Fatal("the record is in the local store")
	}
	a.SettleStored(ctx, idem.Response{Status: 201})
	if rec, err := far.Get(ctx, a.ID); err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("settled in the far store: %+v, %v", rec, err)
	}

	// A tombstone where no finder follows it: a store failure, never a
	// pass.
	id := idem.RecordIDFor(p.RecordNamespace(), "scope", "k2")
	hand := idem.Reservation{ID: id, Token: idem.NewToken(), Lease: time.Minute, Retention: time.Hour, HandOverTo: "elsewhere"}
	if res, err := local.Reserve(ctx, hand); err != nil || res.Outcome != idem.HandedOver {
		t.Fatal(res, err)
	}
	b := New(&Server{Store: local, Observer: idem.NopObserver{}, Log: slog.New(slog.DiscardHandler),
		StoreTimeout: 100 * time.Millisecond, SettleAtEndTimeout: time.Second}, &reporter{})
	b.Policy = policy.Default()
	if prob := b.Admit("scope", "k2"); prob != nil {
		t.Fatal(prob)
	}
	if v := b.Request(ctx, idem.Fingerprint{1}); v.Kind != Answer || v.Problem == nil || v.Problem.Status != 503 {
		t.Fatalf("a moved key without a finder: %+v, want 503", v)
	}
}

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

func (f farHome) StoreFor(*policy.Policy, string, string) HomeStore { return budgeted{f.st, f.budget} }

func (f farHome) HomeOf(*policy.Policy, string) (string, bool) { return "far", false }

// budgeted is a store whose calls have a budget of their own.
type budgeted struct {
	idem.Store
	budget time.Duration
}

func (b budgeted) Budget() time.Duration { return b.budget }

func (b budgeted) Watch(ctx context.Context, id idem.RecordID) (<-chan struct{}, func(), error) {
	return b.Store.(idem.Watcher).Watch(ctx, id)
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
	if v := a.named("scope", false, "k1"); v.Kind != Continue || a.home == nil {
		t.Fatalf("named: %+v (home %v), want continue with the record's home", v, a.home)
	}
	v := a.request(ctx, idem.Fingerprint{1})
	if v.Kind != Wait || v.Wait != 550*time.Millisecond {
		t.Fatalf("first verdict %+v, want a wait of the far budget and the local one", v)
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
	a.settleStored(ctx, idem.Response{Status: 201})
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
	if v := b.named("scope", false, "k2"); v.Kind != Continue {
		t.Fatalf("named: %+v", v)
	}
	if v := b.request(ctx, idem.Fingerprint{1}); v.Kind != answered || v.Problem == nil || v.Problem.Status != 503 {
		t.Fatalf("a moved key without a finder: %+v, want 503", v)
	}
}

// TestAskFitsWhatEnvoyGrants: Envoy ignores an override_message_timeout
// above its max_message_timeout rather than capping it (ext_proc.cc
// Filter::onNewTimeout), so the ask for a far home's calls never exceeds
// Server.MaxMessageTimeout: a duplicate's wait is shortened to what is
// left, down to none.
func TestAskFitsWhatEnvoyGrants(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name          string
		budget        time.Duration
		ask, waitedAt time.Duration
	}{
		// 550 ms of calls, the local 100 ms, two calls after the wait:
		// 1.75 s, so 750 ms of the 2 s wait fit.
		{"wait shortened", 550 * time.Millisecond, 2500 * time.Millisecond, 750 * time.Millisecond},
		// 850 ms of calls leave no room for a wait and its two calls.
		{"no wait", 850 * time.Millisecond, 950 * time.Millisecond, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			far := memstore.New(memstore.Options{})
			srv := &Server{Store: memstore.New(memstore.Options{}), Homes: farHome{far, c.budget}, Observer: idem.NopObserver{},
				Log: slog.New(slog.DiscardHandler), StoreTimeout: 100 * time.Millisecond, SettleAtEndTimeout: time.Second,
				MaxMessageTimeout: 2500 * time.Millisecond}
			p := policy.Default()
			p.Homes = &policy.Homes{Epoch: 1, Default: "far"}
			p.WaitForInFlight = 2 * time.Second
			first := New(srv, &reporter{})
			first.Policy = p
			if v := first.named("scope", false, "k"); v.Kind != Continue {
				t.Fatalf("named: %+v", v)
			}
			if v := first.request(ctx, idem.Fingerprint{1}); v.Kind != Wait || v.Wait > srv.MaxMessageTimeout {
				t.Fatalf("first ask %+v", v)
			}
			if v := first.Await(ctx); v.Kind != Continue {
				t.Fatalf("first %+v", v)
			}
			defer stopRenewing(&first)
			dup := New(srv, &reporter{})
			dup.Policy = p
			if v := dup.named("scope", false, "k"); v.Kind != Continue {
				t.Fatalf("named: %+v", v)
			}
			v := dup.request(ctx, idem.Fingerprint{1})
			if v.Kind != Wait || v.Wait != c.ask {
				t.Fatalf("duplicate's ask %+v, want %v", v, c.ask)
			}
			v = dup.Await(ctx)
			if c.waitedAt == 0 {
				if v.Kind != answered || v.Problem == nil || v.Problem.Slug != "request-in-progress" {
					t.Fatalf("without room to wait: %+v, want 409 at once", v)
				}
				return
			}
			if v.Kind != Wait || dup.waitFor != c.waitedAt {
				t.Fatalf("duplicate %+v waits %v, want a wait of %v", v, dup.waitFor, c.waitedAt)
			}
		})
	}
}

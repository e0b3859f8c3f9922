package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// lateBudget is the store budget of the tests of late reservations. What
// they show holds for any budget (the product's is 100 ms); a wider one
// keeps a loaded machine running the race detector from timing out the
// calls meant to succeed (the cancel, the retry) when the link is healed.
const lateBudget = 300 * time.Millisecond

// lateFilter is the recommended filter with a message_timeout well above
// lateBudget: the server answers 503 itself, before Envoy's timer.
func lateFilter() *extprocfilterv3.ExternalProcessor {
	cfg := envoysim.RecommendedConfig()
	cfg.MessageTimeout = durationpb.New(10 * lateBudget)
	return cfg
}

// TestLateReservationUndone: the link to Redis holds back or slows one
// direction while a reservation is made, so the store's budget runs out
// and the client is told 503 idempotency-store-unavailable ("nothing
// reserved: retry the same key"); then the link heals. Holding or slowing
// the request, the reservation's script reaches Redis after the attempt
// gave up; holding the reply, it ran in time and only its answer was
// late. Either way the
// server that made the reservation undoes it, so the client's retry with
// the same key runs the operation, exactly once, and is neither 409
// request-in-progress nor outcome-unknown.
func TestLateReservationUndone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block func(l *redistest.DelayLink)
		// held: the link keeps what it holds until it heals.
		held bool
	}{
		{"request held", func(l *redistest.DelayLink) { l.Hold(true, false) }, true},
		{"reply held", func(l *redistest.DelayLink) { l.Hold(false, true) }, true},
		// Bytes in flight: the script lands four budgets after it was
		// written.
		{"request slower than the budget", func(l *redistest.DelayLink) { l.SetDelay(4*lateBudget, 0) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{})
			link := redistest.NewDelayLink(t, srv.Addr())
			// The test's own view of Redis, around the link.
			direct := redistest.OpenStore(t, srv.URL(), time.Second)
			metrics := observe.NewMetrics()
			env := harness.Start(t, harness.Options{Store: harness.RedisAt(link.URL()), StoreTimeout: lateBudget,
				Filter: lateFilter(), Metrics: metrics})
			// One operation first, so the store's pool holds a connection
			// the reservation is written on at once (a new connection's
			// handshake would be what the link holds back).
			wantStatus(t, env.Post("/orders", "warm", `{}`), http.StatusCreated)

			tc.block(link)
			wantProblem(t, env.Post("/orders", "late", `{}`), problem.StoreUnavailable)
			if tc.held {
				testwait.Until(t, "the reservation or its answer held in the link", func() bool { return link.Held() > 0 })
			}
			link.SetDelay(0, 0)
			link.Release()
			// Every command the link carried has run, the late reservation
			// among them: its connection, closed by the client when the
			// budget ran out, was drained to Redis and closed by it.
			testwait.Until(t, "the link drained", func() bool {
				closed, drained := link.Drained()
				return link.Held() == 0 && closed >= 1 && closed == drained
			})
			id := idem.RecordIDFor("default", strings.TrimPrefix(env.URL, "http://"), "late")
			testwait.Until(t, "the reservation that landed after its attempt gave up undone", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, err := direct.Get(ctx, id)
				return errors.Is(err, idem.ErrNotFound)
			})
			testwait.Until(t, "the cancel counted", func() bool {
				return counterTotal(t, metrics, "idem_extproc_reservation_cancels_total") == 1
			})
			// Whichever reached Redis first, the reservation or the cancel.
			released, notHeld := cancels(t, metrics, "released"), cancels(t, metrics, "not_held")
			if released+notHeld != 1 {
				t.Fatalf("cancels released %v, not held %v; want one of them", released, notHeld)
			}
			t.Logf("cancel: released %v, not held %v", released, notHeld)

			first := env.Post("/orders", "late", `{}`)
			wantStatus(t, first, http.StatusCreated)
			wantReplayOf(t, env.Post("/orders", "late", `{}`), first)
			if n := env.Upstream.CountKey("late"); n != 1 {
				t.Fatalf("the operation ran %d times, want 1", n)
			}
		})
	}
}

// cancels returns how many reservation cancels m counted with result.
func cancels(t *testing.T, m *observe.Metrics, result string) float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "idem_extproc_reservation_cancels_total" {
			continue
		}
		total := 0.0
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					total += s.GetCounter().GetValue()
				}
			}
		}
		return total
	}
	return 0
}

// TestRedisFarAwayRunsEachOperationOnce: Redis sits 15 ms away (one way)
// behind a link that turns slow now and then (for 100 ms in every 500,
// what enters the link takes longer than the whole budget to cross it),
// so a reservation sent in a slow spell lands after its 503. Clients send new operations and retry each
// with the same key after a 503 or a 409 request-in-progress, as
// docs/problems.md says, until it is answered. Every operation must run
// exactly once and none may end outcome-unknown: a late reservation is
// undone by its server, not left for its lease to run out. Operations
// start until at least minOps were made and minCancels reservations were
// cancelled (or maxOps were made), so the path is taken.
func TestRedisFarAwayRunsEachOperationOnce(t *testing.T) {
	const (
		clients    = 4
		minOps     = 40
		maxOps     = 300
		minCancels = 5
	)
	srv := redistest.Start(t, redistest.Options{})
	link := redistest.NewDelayLink(t, srv.Addr())
	metrics := observe.NewMetrics()
	p := policy.Default()
	// A lease far longer than a cancel takes, and short enough that a
	// reservation left standing ends outcome-unknown within the test.
	p.Lease = 10 * time.Second
	env := harness.Start(t, harness.Options{Store: harness.RedisAt(link.URL()), StoreTimeout: lateBudget,
		Filter: lateFilter(), Metrics: metrics, Policies: &policy.Set{Policies: []*policy.Policy{p}}})
	wantStatus(t, env.Post("/orders", "warm", `{}`), http.StatusCreated)

	stop := make(chan struct{})
	swung := make(chan struct{})
	go func() {
		defer close(swung)
		for slow := false; ; slow = !slow {
			d, spell := 15*time.Millisecond, 400*time.Millisecond
			if slow {
				d, spell = lateBudget+100*time.Millisecond, 100*time.Millisecond
			}
			link.SetDelay(d, d)
			select {
			case <-stop:
				link.SetDelay(0, 0)
				return
			case <-time.After(spell):
			}
		}
	}()

	var (
		mu       sync.Mutex
		keys     []string
		answered = map[string]int{} // answers per operation, 503s and 409s included
	)
	next := make(chan int)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for n := range next {
				key := fmt.Sprintf("far-%d", n)
				mu.Lock()
				keys = append(keys, key)
				mu.Unlock()
				deadline := time.Now().Add(testwait.Bound)
				for {
					r := env.Post("/orders", key, `{}`)
					mu.Lock()
					answered[key]++
					mu.Unlock()
					if r.Err == nil && r.Status == http.StatusCreated {
						break
					}
					retry := r.Err == nil && (r.Status == http.StatusServiceUnavailable ||
						r.Status == http.StatusConflict && strings.Contains(r.Body, problem.InProgress.Slug))
					if !retry {
						t.Errorf("%s: %d %s %v", key, r.Status, r.Body, r.Err)
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("%s: still %d after %v", key, r.Status, testwait.Bound)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	ops := 0
	for ; ops < maxOps && !t.Failed(); ops++ {
		if ops >= minOps && counterTotal(t, metrics, "idem_extproc_reservation_cancels_total") >= minCancels {
			break
		}
		next <- ops
	}
	close(next)
	wg.Wait()
	close(stop)
	<-swung
	for _, k := range keys {
		if n := env.Upstream.CountKey(k); n != 1 {
			t.Errorf("%s ran %d times, want 1", k, n)
		}
	}
	retried := 0
	for _, n := range answered {
		retried += n - 1
	}
	t.Logf("%d operations, %d retries; cancels: released %v, not held %v, failed %v", ops, retried,
		cancels(t, metrics, "released"), cancels(t, metrics, "not_held"), cancels(t, metrics, "failed"))
}

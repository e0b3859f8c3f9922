package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/harness"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testwait"
)

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
		// Bytes in flight: the script lands 400 ms after it was written,
		// long after the 100 ms budget ended.
		{"request slower than the budget", func(l *redistest.DelayLink) { l.SetDelay(400*time.Millisecond, 0) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{})
			link := redistest.NewDelayLink(t, srv.Addr())
			// The test's own view of Redis, around the link.
			direct := redistest.OpenStore(t, srv.URL(), time.Second)
			// A store budget of 100 ms inside a message_timeout of 1 s: the
			// server answers 503 itself, before Envoy's timer.
			cfg := envoysim.RecommendedConfig()
			cfg.MessageTimeout = durationpb.New(time.Second)
			metrics := observe.NewMetrics()
			env := harness.Start(t, harness.Options{Store: harness.RedisAt(link.URL()), StoreTimeout: idem.DefaultStoreTimeout,
				Filter: cfg, Metrics: metrics})
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
			testwait.Until(t, "the reservation given up on cancelled", func() bool {
				return counterTotal(t, metrics, "idem_extproc_reservation_cancels_total") == 1
			})
			// Whichever reached Redis first, the reservation or the cancel.
			released, notHeld := cancels(t, metrics, "released"), cancels(t, metrics, "not_held")
			if released+notHeld != 1 {
				t.Fatalf("cancels released %v, not held %v; want one of them", released, notHeld)
			}
			t.Logf("cancel: released %v, not held %v", released, notHeld)
			id := idem.RecordIDFor("default", strings.TrimPrefix(env.URL, "http://"), "late")
			testwait.Until(t, "the reservation that landed after its attempt gave up undone", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				_, err := direct.Get(ctx, id)
				return errors.Is(err, idem.ErrNotFound)
			})

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

package observe_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/observe"
)

// bare hides every optional capability of the store it holds: only the
// idem.Store methods are promoted.
type bare struct{ idem.Store }

// watchOnly keeps Watch and hides the admin operations.
type watchOnly struct {
	idem.Store
	idem.Watcher
}

// adminOnly keeps the admin operations and hides Watch.
type adminOnly struct {
	idem.Store
	idem.Admin
}

// TestInstrumentStoreKeepsCapabilities: the wrapper has Watch and the admin
// operations exactly when the wrapped store has them, so that a caller
// (wait_for_in_flight, the admin API) that asks the store what it can do
// is told the truth. Before, the wrapper claimed both whatever the store
// behind it had, and a wait on a store without Watch failed on every
// duplicate instead of at start.
func TestInstrumentStoreKeepsCapabilities(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	for _, tc := range []struct {
		name         string
		st           idem.Store
		watch, admin bool
	}{
		{"both", ms, true, true},
		{"neither", bare{ms}, false, false},
		{"watch", watchOnly{ms, ms}, true, false},
		{"admin", adminOnly{ms, ms}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w idem.Store = observe.InstrumentStore(tc.st, observe.NewMetrics(), nil)
			if _, ok := w.(idem.Watcher); ok != tc.watch {
				t.Errorf("wrapper is a Watcher: %v, want %v", ok, tc.watch)
			}
			if _, ok := w.(idem.Admin); ok != tc.admin {
				t.Errorf("wrapper is an Admin: %v, want %v", ok, tc.admin)
			}
		})
	}
}

// TestInstrumentStoreTimesCapabilities: the calls of a capability the
// wrapper passes on are timed like the others.
func TestInstrumentStoreTimesCapabilities(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	m := observe.NewMetrics()
	var w idem.Store = observe.InstrumentStore(ms, m, nil)
	ctx := context.Background()
	id := idem.RecordID("r1")
	_, stop, err := w.(idem.Watcher).Watch(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := w.(idem.Admin).Purge(ctx, id); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("purge of no record: %v", err)
	}
	for op, want := range map[string]uint64{"watch": 1, "purge": 1} {
		if got := storeCalls(t, m, op); got != want {
			t.Errorf("store calls %s: %d, want %d", op, got, want)
		}
	}
}

// storeCalls counts the timed calls of op, whatever their result.
func storeCalls(t *testing.T, m *observe.Metrics, op string) uint64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != observe.Namespace+"_store_call_duration_seconds" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			if labelValue(mm, "op") == op {
				n += mm.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// ownFailure is an error a store marks as a failure of its own making, as
// redisstore's refused replies and recovered panics are.
type ownFailure string

func (e ownFailure) Error() string        { return string(e) }
func (e ownFailure) StoreFailure() string { return string(e) }

// failing answers every reservation with its error.
type failing struct {
	idem.Store
	err error
}

func (f failing) Reserve(context.Context, idem.Reservation) (idem.ReserveResult, error) {
	return idem.ReserveResult{}, f.err
}

// TestStoreFailuresAreCountedByKind: a refused reply or a panic under a
// store call is counted by kind, wrapped or not, and still counted as an
// error of the call, so that the alerts on store errors fire for it.
func TestStoreFailuresAreCountedByKind(t *testing.T) {
	m := observe.NewMetrics()
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	for _, err := range []error{ownFailure("panic"), fmt.Errorf("reserve: %w", ownFailure("reply_refused")), errors.New("other")} {
		_, _ = observe.InstrumentStore(failing{ms, err}, m, nil).Reserve(context.Background(), idem.Reservation{})
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == observe.Namespace+"_store_failures_total" {
			for _, s := range mf.GetMetric() {
				got[labelValue(s, "kind")] = s.GetCounter().GetValue()
			}
		}
	}
	if got["panic"] != 1 || got["reply_refused"] != 1 || len(got) != 2 {
		t.Errorf("store_failures_total = %v, want one panic and one reply_refused", got)
	}
	if n := storeCalls(t, m, "reserve"); n != 3 {
		t.Errorf("%d reserve calls timed, want 3", n)
	}
}

package server

import (
	"context"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/observe"
)

// TestMetricsWrapTheStore: with Metrics the ext_proc server calls the
// instrumented store (each call counted), without them the bare one.
func TestMetricsWrapTheStore(t *testing.T) {
	st := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = st.Close() })
	gs, bare, _ := New(Config{Config: extproc.Config{Store: st}})
	gs.Stop()
	if bare != st {
		t.Fatalf("without Metrics the store is %T, want the memstore itself", bare)
	}
	gs, wrapped, _ := New(Config{Config: extproc.Config{Store: st}, Metrics: observe.NewMetrics()})
	gs.Stop()
	// The instrumented store keeps exactly the capabilities of the one it
	// wraps (observe.InstrumentStore): the memstore watches and administers.
	if wrapped == idem.Store(st) {
		t.Fatal("with Metrics the store is the bare memstore, not the instrumented one")
	}
	if _, ok := wrapped.(idem.Watcher); !ok {
		t.Fatalf("with Metrics the store (%T) lost the memstore's Watch", wrapped)
	}
	if err := wrapped.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := gs.GetServiceInfo()["envoy.service.ext_proc.v3.ExternalProcessor"]; !ok {
		t.Fatal("ext_proc is not registered")
	}
}

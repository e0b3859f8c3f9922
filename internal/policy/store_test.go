package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
)

// noWatch is a store without the optional Watch.
type noWatch struct{ idem.Store }

// TestCheckStoreRefusesMissingCapability: a policy that waits for the first
// attempt is refused with a store that cannot watch, and accepted with one
// that can; a set that does not wait is accepted with either.
func TestCheckStoreRefusesMissingCapability(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	waits := Default()
	waits.Name, waits.WaitForInFlight = "orders", time.Second
	set := &Set{Policies: []*Policy{waits, Default()}}
	err := set.CheckStore(noWatch{ms})
	if err == nil || !strings.Contains(err.Error(), `policy "orders" sets wait_for_in_flight`) {
		t.Fatalf("store without Watch: %v", err)
	}
	if err := set.CheckStore(ms); err != nil {
		t.Fatalf("store with Watch: %v", err)
	}
	if err := DefaultSet().CheckStore(noWatch{ms}); err != nil {
		t.Fatalf("no wait: %v", err)
	}
}

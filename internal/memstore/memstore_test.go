package memstore_test

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) idem.Store {
		s := memstore.New(memstore.Options{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestProperty runs the state-machine property test with the store's clock
// in the test's hands, so lease expiry is exact.
func TestProperty(t *testing.T) {
	clock := storetest.NewFakeClock()
	storetest.RunProperty(t, func(t *testing.T) idem.Store {
		s := memstore.New(memstore.Options{Now: clock.Now})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}, storetest.PropertyOptions{Seeds: 8, Steps: 2000, Clock: clock})
}

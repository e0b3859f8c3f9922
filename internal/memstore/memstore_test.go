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

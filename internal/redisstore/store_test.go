package redisstore_test

import (
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/redistest"
	"github.com/idem-extproc/idem-extproc/internal/storetest"
)

const testCallTimeout = time.Second

func TestContractStandalone(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	storetest.Run(t, func(t *testing.T) idem.Store {
		// A generous call budget: on a loaded two-core machine running the
		// race detector, 50 concurrent reservations can take longer than
		// the production 100 ms, which is a latency matter, not the
		// contract this suite checks.
		rdb, err := redisstore.NewClient(srv.URL(), testCallTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rdb.Close() })
		st := redisstore.New(rdb, redisstore.Options{CallTimeout: testCallTimeout})
		t.Cleanup(func() { _ = st.Close() })
		return st
	})
}

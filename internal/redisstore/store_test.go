package redisstore_test

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/redistest"
	"github.com/idem-extproc/idem-extproc/internal/storetest"
)

func TestContractStandalone(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	storetest.Run(t, func(t *testing.T) idem.Store {
		rdb, err := redisstore.NewClient(srv.URL(), 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rdb.Close() })
		st := redisstore.New(rdb, redisstore.Options{})
		t.Cleanup(func() { _ = st.Close() })
		return st
	})
}

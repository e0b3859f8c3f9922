package harness

import (
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// StoreOption picks the store an Env's server uses (Options.Store). The
// default, nil, is NewRedis(): a redis-server of the test's own.
type StoreOption func(t testing.TB, storeTimeout time.Duration) (idem.Store, *redistest.Server)

// NewRedis starts a redis-server for the test, with extra arguments such
// as "--maxmemory", "2mb"; Env.Redis is that server.
func NewRedis(args ...string) StoreOption {
	return func(t testing.TB, timeout time.Duration) (idem.Store, *redistest.Server) {
		srv := redistest.Start(t, redistest.Options{Args: args})
		return redistest.OpenStore(t, srv.URL(), timeout), srv
	}
}

// OnRedis uses a redis-server already running (shared with another Env, or
// started with options of its own); Env.Redis is that server.
func OnRedis(srv *redistest.Server) StoreOption {
	return func(t testing.TB, timeout time.Duration) (idem.Store, *redistest.Server) {
		return redistest.OpenStore(t, srv.URL(), timeout), srv
	}
}

// RedisAt uses Redis at a URL of any form redisstore.NewClient accepts
// (standalone, Sentinel, Cluster); Env.Redis is nil.
func RedisAt(url string) StoreOption {
	return func(t testing.TB, timeout time.Duration) (idem.Store, *redistest.Server) {
		return redistest.OpenStore(t, url, timeout), nil
	}
}

// Memory uses the in-memory store; Env.Redis is nil.
func Memory(opts memstore.Options) StoreOption {
	return func(t testing.TB, _ time.Duration) (idem.Store, *redistest.Server) {
		ms := memstore.New(opts)
		t.Cleanup(func() { _ = ms.Close() })
		return ms, nil
	}
}

// storeOption is the option o says: a redis-server of the test's own
// unless Store names another.
func (o Options) storeOption() StoreOption {
	if o.Store != nil {
		return o.Store
	}
	return NewRedis()
}

package grpcxds

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/xds"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/server"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// Options configures an Env. The zero value starts a real redis-server,
// the idem-extproc server with the default policy, and the filter of
// FilterConfig.
type Options struct {
	// Policies replaces the default policy set.
	Policies *policy.Set
	// ServerAddr points the filter at an ext_proc server already running
	// (the built binary, say) instead of starting one in process. Policies,
	// StoreTimeout and Logger then do not apply: that server has its own
	// flags.
	ServerAddr string
	// Redis is the server the ext_proc server stores in, kept in Env.Redis
	// so that a test can inspect or kill it. When nil, Start starts one for
	// its in-process server; with ServerAddr set it starts none, since only
	// the caller knows which Redis that server was given.
	Redis *redistest.Server
	// StoreTimeout is the server's store budget (one second when zero, so
	// that a loaded machine running the race detector stays correct).
	StoreTimeout time.Duration
	// Logger receives the in-process server's logs; none when nil.
	Logger *slog.Logger
}

// Env is grpc-go's client, configured over xDS with the ext_proc filter,
// in front of a counting upstream, with idem-extproc as the processor.
type Env struct {
	// Redis is nil when Options.ServerAddr was set without Options.Redis.
	Redis    *redistest.Server
	Upstream *Upstream
	Control  *ControlPlane
	// ServerAddr is the ext_proc server's address.
	ServerAddr string
	// Conn dials xds:///ServiceName.
	Conn   *grpc.ClientConn
	Client testgrpc.TestServiceClient
}

// ServiceName is the xDS listener the client dials.
const ServiceName = "orders"

// Start builds an Env and tears it down when the test ends.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	if opts.StoreTimeout == 0 {
		opts.StoreTimeout = time.Second
	}
	e := &Env{Redis: opts.Redis, ServerAddr: opts.ServerAddr}
	if e.ServerAddr == "" {
		if e.Redis == nil {
			e.Redis = redistest.Start(t, redistest.Options{})
		}
		e.ServerAddr = e.serve(t, opts)
	}
	e.Upstream = StartUpstream(t)
	e.Control = StartControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Control.Update(ctx, Service{Name: ServiceName, Backend: e.Upstream.Addr, Filter: FilterConfig(e.ServerAddr)}); err != nil {
		t.Fatal(err)
	}
	resolver, err := xds.NewXDSResolverWithConfigForTesting(e.Control.Bootstrap())
	if err != nil {
		t.Fatal(err)
	}
	e.Conn, err = grpc.NewClient("xds:///"+ServiceName,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Conn.Close() })
	e.Client = testgrpc.NewTestServiceClient(e.Conn)
	return e
}

func (e *Env) serve(t testing.TB, opts Options) string {
	st := redistest.OpenStore(t, e.Redis.URL(), opts.StoreTimeout)
	cfg := extproc.Config{Store: st, StoreTimeout: opts.StoreTimeout, Logger: opts.Logger}
	if opts.Policies != nil {
		set := opts.Policies
		cfg.Policies = func() *policy.Set { return set }
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs, _, _ := server.New(server.Config{Config: cfg})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

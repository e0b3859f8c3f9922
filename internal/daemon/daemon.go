// Package daemon runs idem-extproc: it opens the store, serves ext_proc and
// gRPC health on one port and /healthz, /readyz, /metrics and the admin API
// on another, reloads the configuration, and drains open streams on
// shutdown.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idem-extproc/idem-extproc/internal/admin"
	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/seal"
	"github.com/idem-extproc/idem-extproc/internal/tlsfiles"
)

// ErrConfig marks a startup failure caused by the configuration: the
// policy file, or a file a flag names (Main exits 2 on it, as on a bad
// flag).
var ErrConfig = errors.New("configuration error")

// Daemon is a running server.
type Daemon struct {
	cfg      Config
	log      *slog.Logger
	store    idem.Store
	closers  []func() error
	grpc     *grpc.Server
	health   *health.Server
	admin    *http.Server
	lis      net.Listener
	adminLis net.Listener
	policies *config.Source
	metrics  *observe.Metrics
	sealer   extproc.Sealer
	draining atomic.Bool
	errc     chan error
	// stopWatch ends the configuration watcher, the SIGHUP handler and the
	// health checker.
	stopWatch context.CancelFunc
	// safety checks the Redis store's settings and data (Redis only).
	safety *storeSafety
	// shutdownTracing flushes spans on the way out.
	shutdownTracing func(context.Context) error
}

// NewLogger builds the daemon's logger from its configuration.
func NewLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// newTracerProvider is observe.NewTracerProvider; tests replace it to see
// that a failed start shuts tracing down.
var newTracerProvider = observe.NewTracerProvider

// Start opens the store and the listeners and starts serving. getenv
// supplies the OTEL_* variables for tracing (os.Getenv in production).
// On any failure it closes what it had opened (abort), so that a caller
// that retries, or a test, finds the ports free and nothing running.
func Start(cfg Config, log *slog.Logger, getenv func(string) string) (_ *Daemon, err error) {
	d := &Daemon{cfg: cfg, log: log, errc: make(chan error, 2), metrics: observe.NewMetrics()}
	defer func() {
		if err != nil {
			d.abort()
		}
	}()
	if cfg.AdminTokenFile != "" {
		if _, err := admin.ReadToken(cfg.AdminTokenFile); err != nil {
			return nil, fmt.Errorf("%w: --admin-token-file: %w", ErrConfig, err)
		}
	}
	var ring *seal.Ring
	if cfg.EncryptionKeysFile != "" {
		if ring, err = seal.LoadRing(cfg.EncryptionKeysFile, log); err != nil {
			return nil, fmt.Errorf("%w: --encryption-keys-file: %w", ErrConfig, err)
		}
	}
	needsRing := func(set *policy.Set) error {
		for _, p := range set.Policies {
			if p.Encrypt && ring == nil {
				return fmt.Errorf("policy %q has encrypt: true but the server has no --encryption-keys-file", p.Name)
			}
		}
		return nil
	}
	if d.policies, err = config.NewSource(cfg.ConfigFile, log, needsRing); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.metrics.KnowPolicies(policyNames(d.policies.Current()))
	d.policies.OnReload = func(err error) {
		d.metrics.ConfigReloaded(err)
		if err == nil {
			d.metrics.KnowPolicies(policyNames(d.policies.Current()))
		}
	}
	d.sealer = sealerOrNil(ring)
	tp, shutdownTracing, err := newTracerProvider(context.Background(), getenv)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	d.shutdownTracing = shutdownTracing
	if observe.TracingEnabled(getenv) {
		log.Info("tracing: exporting spans over OTLP as the OTEL_* environment says")
	} else {
		// No provider at all: the server and the store then skip span
		// work, which even a no-op provider costs (a context per span).
		tp = nil
	}
	if err := d.openStore(); err != nil {
		return nil, err
	}
	d.store = observe.InstrumentStore(d.store, d.metrics, tp)
	if d.lis, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("--listen %s: %w", cfg.Listen, err)
	}
	if cfg.AdminListen != "" {
		if d.adminLis, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			return nil, fmt.Errorf("--admin-listen %s: %w", cfg.AdminListen, err)
		}
	}

	watchCtx, stopWatch := context.WithCancel(context.Background())
	d.stopWatch = stopWatch
	if err := d.policies.Watch(watchCtx); err != nil {
		log.Warn("configuration file not watched; reload with SIGHUP", slog.String("error", err.Error()))
	}
	d.reloadOnHangup(watchCtx)
	budget := cfg.MaxBufferedBytes
	if budget == 0 {
		budget = DefaultMaxBufferedBytes(os.ReadFile)
	}
	srv := extproc.New(extproc.Config{
		MaxBufferedBytes: budget,
		Store:            d.store,
		Policies:         d.policies.Current,
		Logger:           log,
		StoreTimeout:     cfg.StoreTimeout,
		Observer:         d.metrics,
		TracerProvider:   tp,
		Sealer:           sealerOrNil(ring),
	})
	gopts := StreamServerOptions(cfg.MaxMessageSize)
	if cfg.TLSCertFile != "" {
		ts, err := tlsfiles.NewServer(tlsfiles.Files{
			Cert: cfg.TLSCertFile, Key: cfg.TLSKeyFile, ClientCA: cfg.TLSClientCAFile, AllowedSANs: cfg.TLSAllowedSANs,
		}, log)
		if err != nil {
			return nil, fmt.Errorf("%w: --tls-cert-file, --tls-key-file, --tls-client-ca-file: %w", ErrConfig, err)
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(ts.Config())))
	}
	d.grpc = grpc.NewServer(gopts...)
	extprocv3.RegisterExternalProcessorServer(d.grpc, srv)
	d.health = health.NewServer()
	healthpb.RegisterHealthServer(d.grpc, d.health)
	d.checkHealth(watchCtx)
	if d.safety != nil {
		d.safety.watch(watchCtx)
	}
	go func() { d.errc <- d.grpc.Serve(d.lis) }()

	if d.adminLis != nil {
		d.admin = &http.Server{Handler: d.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := d.admin.Serve(d.adminLis); !errors.Is(err, http.ErrServerClosed) {
				d.errc <- err
			}
		}()
	}
	log.Info("idem-extproc serving", slog.String("listen", d.lis.Addr().String()),
		slog.String("admin_listen", d.AdminAddr()), slog.String("store", d.storeName()),
		slog.String("config", cfg.ConfigFile), slog.Int("policies", len(d.policies.Current().Policies)),
		slog.Int64("max_buffered_bytes", budget))
	return d, nil
}

// abort closes what a failed Start opened, newest first: the watchers and
// the SIGHUP handler, the listeners, the store, tracing. Each field is set
// only once its resource is open, so the order of Start's steps may change
// without touching it.
func (d *Daemon) abort() {
	if d.stopWatch != nil {
		d.stopWatch()
	}
	if d.adminLis != nil {
		_ = d.adminLis.Close()
	}
	if d.lis != nil {
		_ = d.lis.Close()
	}
	d.closeStore()
	if d.shutdownTracing != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = d.shutdownTracing(ctx)
		cancel()
	}
}

func (d *Daemon) openStore() error {
	if d.cfg.RedisURL == "" {
		d.log.Warn("no --redis-url: using the in-memory store; records live in this process only, " +
			"so run exactly one replica and expect them to vanish on restart")
		ms := memstore.New(memstore.Options{MaxRecords: d.cfg.MemoryMaxRecords})
		d.store = ms
		d.closers = append(d.closers, ms.Close)
		return nil
	}
	rdb, err := redisstore.NewSecureClient(d.cfg.RedisURL, d.cfg.StoreTimeout, d.cfg.RedisSecurity)
	if err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	st := redisstore.New(rdb, redisstore.Options{CallTimeout: d.cfg.StoreTimeout})
	d.store = st
	d.closers = append(d.closers, st.Close, rdb.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := d.store.Ping(ctx); err != nil {
		// Not fatal: Redis may come up later; /readyz tells until then.
		d.log.Warn("redis does not answer yet; not ready until it does", slog.String("error", err.Error()))
	}
	if err := d.checkStoreAtStart(st); err != nil {
		d.closeStore()
		d.closers = nil
		return err
	}
	return nil
}

func (d *Daemon) storeName() string {
	if d.cfg.RedisURL == "" {
		return "memory"
	}
	return "redis"
}

func (d *Daemon) closeStore() {
	for _, c := range d.closers {
		_ = c()
	}
}

func policyNames(set *policy.Set) []string {
	names := make([]string, 0, len(set.Policies))
	for _, p := range set.Policies {
		names = append(names, p.Name)
	}
	return names
}

// sealerOrNil keeps a nil *seal.Ring from becoming a non-nil interface.
func sealerOrNil(r *seal.Ring) extproc.Sealer {
	if r == nil {
		return nil
	}
	return r
}

// StreamServerOptions are the options of the gRPC server that serves
// ext_proc: the largest message accepted, and stream workers. Each ext_proc
// stream is one HTTP request whose handler runs deep (decision, store,
// Redis client); started on a fresh goroutine it grows its stack two or
// three times, copying it each time, which profiles showed to be a tenth of
// the server's CPU. Long-lived workers keep their grown stacks, so a stream
// they take costs no growth; a stream that finds every worker busy gets a
// goroutine of its own, as without workers. The load tool's reference
// servers use the same options.
//
// A stream holds its worker for the whole HTTP request, upstream time
// included, so the workers are many: StreamWorkersPerCPU per GOMAXPROCS.
// Idle, each costs a parked goroutine whose stack the garbage collector
// shrinks.
func StreamServerOptions(maxMessageSize int) []grpc.ServerOption {
	workers := uint32(StreamWorkersPerCPU * runtime.GOMAXPROCS(0))
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(maxMessageSize), grpc.NumStreamWorkers(workers)}
}

// StreamWorkersPerCPU sizes the stream workers (StreamServerOptions).
const StreamWorkersPerCPU = 128

// HealthCheckInterval is how often the gRPC health status follows the
// store.
const HealthCheckInterval = 2 * time.Second

// checkHealth keeps the standard gRPC health service (which Envoy's gRPC
// health checks ask) in step with the store until ctx ends: SERVING while
// the store answers, NOT_SERVING otherwise.
func (d *Daemon) checkHealth(ctx context.Context) {
	set := func() {
		st := healthpb.HealthCheckResponse_SERVING
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := d.store.Ping(pctx); err != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		for _, svc := range []string{"", extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
			d.health.SetServingStatus(svc, st)
		}
	}
	set()
	go func() {
		t := time.NewTicker(HealthCheckInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				set()
			}
		}
	}()
}

// reloadOnHangup reloads the configuration on SIGHUP until ctx ends.
func (d *Daemon) reloadOnHangup(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				d.log.Info("SIGHUP: reloading the configuration")
				_ = d.policies.Reload()
			}
		}
	}()
}

// Reload reads the configuration file again, as SIGHUP does.
func (d *Daemon) Reload() error { return d.policies.Reload() }

// Addr returns the ext_proc listener's address.
func (d *Daemon) Addr() string { return d.lis.Addr().String() }

// AdminAddr returns the admin listener's address, or "".
func (d *Daemon) AdminAddr() string {
	if d.adminLis == nil {
		return ""
	}
	return d.adminLis.Addr().String()
}

// Metrics returns the daemon's metrics.
func (d *Daemon) Metrics() *observe.Metrics { return d.metrics }

// Store returns the daemon's store.
func (d *Daemon) Store() idem.Store { return d.store }

func (d *Daemon) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metrics.Handler())
	if d.cfg.AdminTokenFile != "" {
		st, ok := d.store.(admin.Store)
		if !ok {
			d.log.Error("admin API off: the store has no admin operations")
		} else {
			mux.Handle(admin.Prefix, admin.Handler(admin.Config{
				Store: st, Policies: d.policies.Current, TokenFile: d.cfg.AdminTokenFile,
				Logger: d.log, OnAction: d.metrics.AdminAction, Sealer: d.sealer, Counters: d.metrics,
			}))
		}
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if d.draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := d.store.Ping(ctx); err != nil {
			http.Error(w, "store unavailable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}

// Wait serves until ctx ends, then shuts down: readiness turns false, new
// streams are refused, open streams get up to DrainTimeout to finish (their
// completions are still written), and the store is closed.
func (d *Daemon) Wait(ctx context.Context) error {
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-d.errc:
	}
	d.Shutdown()
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return serveErr
	}
	return nil
}

// Shutdown drains and stops the daemon.
func (d *Daemon) Shutdown() {
	if d.draining.Swap(true) {
		return
	}
	d.log.Info("shutting down: draining open streams", slog.String("drain_timeout", d.cfg.DrainTimeout.String()))
	d.stopWatch()
	d.health.Shutdown()
	done := make(chan struct{})
	go func() {
		d.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d.cfg.DrainTimeout):
		d.log.Warn("drain timeout passed; closing the remaining streams")
		d.grpc.Stop()
		<-done
	}
	if d.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = d.admin.Shutdown(ctx)
		cancel()
	}
	d.closeStore()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = d.shutdownTracing(ctx)
	cancel()
	d.log.Info("stopped")
}

// Main runs the daemon with command-line args until ctx ends, and returns
// the process exit code.
func Main(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := ParseConfig(args, getenv, stderr)
	if errors.Is(err, ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "idem-extproc: configuration error:\n%v\n", err)
		return 2
	}
	// Log lines reach stderr through one writer goroutine, which batches
	// them when the server is busy (see lineWriter).
	lw := newLineWriter(stderr)
	defer lw.Close()
	log := NewLogger(cfg, lw)
	// go-redis has one logger per process; Main is the process's entry.
	redis.SetLogger(redisLog{log})
	d, err := Start(cfg, log, getenv)
	if errors.Is(err, ErrConfig) {
		fmt.Fprintf(stderr, "idem-extproc: %v\n", err)
		return 2
	}
	if err != nil {
		log.Error("startup failed", slog.String("error", err.Error()))
		return 1
	}
	if err := d.Wait(ctx); err != nil {
		log.Error("server failed", slog.String("error", err.Error()))
		return 1
	}
	return 0
}

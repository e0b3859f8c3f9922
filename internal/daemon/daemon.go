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
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idem-extproc/idem-extproc/internal/admin"
	"github.com/idem-extproc/idem-extproc/internal/asynclog"
	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/region"
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
	grpc     *grpc.Server
	health   *health.Server
	admin    *http.Server
	lis      net.Listener
	adminLis net.Listener
	policies *config.Source
	metrics  *observe.Metrics
	sealer   idem.Sealer
	draining atomic.Bool
	errc     chan error
	// cleanup holds what Start opened, closed newest first (startup.go).
	cleanup cleanupStack
	// ext is the ext_proc server; Shutdown waits for its background work.
	ext *extproc.Server
	// watchCtx ends, by stopWatch, the configuration watcher, the SIGHUP
	// handler and the health checker.
	watchCtx  context.Context
	stopWatch context.CancelFunc
	// safety checks the Redis store's settings and data (Redis only).
	safety *storeSafety
	// ownRTT is the round trip to --redis-url's Redis measured at start
	// (ownRTTErr when it did not answer): it chooses the batching and, with
	// --region, is checked against --store-timeout.
	ownRTT    time.Duration
	ownRTTErr error
	// router finds each scope's home region's store; regionMetrics counts
	// its work (both nil without --region).
	router        *region.Router
	regionMetrics *observe.Regions
	// unloaded are the other regions' stores whose scripts did not load
	// at start: keepRegionsWarm loads them.
	unloaded map[string]*redisstore.Store
	// reloadMu guards onReload, which OnReload adds to while the file
	// watcher may be reporting a reload.
	reloadMu sync.Mutex
	onReload []func(*policy.Set, error)
}

// NewLogger builds the daemon's logger from its configuration (the server
// and the demo subcommand share it).
func NewLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// logFormat builds the handler the log queue (asynclog.Queue) formats with: NewLogger's, with
// JSON lines written by asynclog.NewJSONLineHandler (the same bytes, cheaper to format).
func logFormat(cfg Config) func(io.Writer) slog.Handler {
	return func(w io.Writer) slog.Handler {
		if cfg.LogFormat == "text" {
			return NewLogger(cfg, w).Handler()
		}
		return asynclog.NewJSONLineHandler(w, &slog.HandlerOptions{Level: cfg.LogLevel})
	}
}

func (d *Daemon) storeName() string {
	if d.cfg.RedisURL == "" {
		return "memory"
	}
	return "redis"
}

// healthCheckInterval is how often the gRPC health status follows the
// store.
const healthCheckInterval = 2 * time.Second

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
	go every(ctx, healthCheckInterval, func() bool { set(); return true })
}

// every calls f every interval until ctx ends or f returns false.
func every(ctx context.Context, interval time.Duration, f func() bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !f() {
				return
			}
		}
	}
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

// Policies returns the policies in force.
func (d *Daemon) Policies() *policy.Set { return d.policies.Current() }

// OnReload adds f to those told of every reload that found the
// configuration file changed (by the file watcher, SIGHUP or Reload): set
// is the policies in force after it, the new ones or, when the reload was
// rejected, the ones that stay, and err why it was rejected. f runs on the
// reloading goroutine, in the order of the reloads; the next reload waits
// for it. A reload that ends before OnReload returns may not be told:
// read Policies after OnReload to start from what is in force.
func (d *Daemon) OnReload(f func(set *policy.Set, err error)) {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	d.onReload = append(d.onReload, f)
}

// reloaded tells the OnReload functions of a reload.
func (d *Daemon) reloaded(err error) {
	d.reloadMu.Lock()
	fs := slices.Clone(d.onReload)
	d.reloadMu.Unlock()
	set := d.policies.Current()
	for _, f := range fs {
		f(set, err)
	}
}

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
	if d.ext != nil {
		// The cancels of reservations given up on run after their answers,
		// each bounded by the settle timeout the daemon leaves at its
		// default; they need the store.
		ctx, cancel := context.WithTimeout(context.Background(), extproc.DefaultSettleAtEndTimeout)
		if err := d.ext.Wait(ctx); err != nil {
			d.log.Warn("closing the store with cancels still running; they fail and are counted", slog.String("error", err.Error()))
		}
		cancel()
	}
	d.cleanup.unwind() // the store, then tracing
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
	// Log records are formatted and written to stderr by one goroutine,
	// off the request path, in batches when the server is busy (asynclog.Queue).
	logQueue, log := asynclog.New(stderr, logFormat(cfg))
	defer func() {
		if n := logQueue.Waits(); n > 0 {
			log.Warn("the log output was slower than the server: requests waited for it", slog.Uint64("waits", n))
		}
		_ = logQueue.Close()
	}()
	// go-redis has one logger per process; Main is the process's entry.
	redis.SetLogger(redisLog{log})
	// So are the collector's settings.
	budget := cfg.MaxBufferedBytes
	if budget == 0 {
		budget = defaultMaxBufferedBytes(os.ReadFile)
	}
	gc := planGC(cfg, budget, getenv, os.ReadFile)
	percent, limit := gc.apply()
	log.Info("garbage collector", slog.Int("gc_percent", percent), slog.String("gc_percent_from", gc.percentFrom),
		slog.Int64("memory_limit", limit), slog.String("memory_limit_from", gc.limitFrom))
	var pacer *bodyPacer
	if percent > 0 {
		pacer = startBodyPacer(percent)
		defer pacer.stop()
	}
	d, err := start(cfg, log, getenv, pacer)
	if errors.Is(err, ErrConfig) {
		_ = logQueue.Close() // the lines logged so far first, and no write to stderr beside this one
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

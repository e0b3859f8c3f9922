package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace"
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
	"github.com/idem-extproc/idem-extproc/internal/server"
	"github.com/idem-extproc/idem-extproc/internal/tlsfiles"
)

// Start runs the one startup sequence: first it reads and checks every
// file the configuration names (validate), with nothing open yet; then it
// opens tracing, the store and the listeners, each pushed onto one cleanup
// stack (open); then it starts serving. A failure anywhere unwinds the
// stack, newest first, so that a caller that retries, or a test, finds the
// ports free and nothing running. getenv supplies the OTEL_* variables for
// tracing (os.Getenv in production).
func Start(cfg Config, log *slog.Logger, getenv func(string) string) (*Daemon, error) {
	return start(cfg, log, getenv, nil)
}

// start is Start with the collector's pacing for the server's bodies, when
// pacer is not nil: Main's, one per process.
func start(cfg Config, log *slog.Logger, getenv func(string) string, pacer *bodyPacer) (_ *Daemon, err error) {
	metrics := observe.NewMetrics()
	files, err := validate(cfg, log, metrics.ConfigReloaded)
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, errc: make(chan error, 2), metrics: metrics,
		policies: files.policies, sealer: files.sealer}
	defer func() {
		if err != nil {
			d.cleanup.unwind()
		}
	}()
	tp, err := d.open(getenv)
	if err != nil {
		return nil, err
	}
	d.serve(files, tp, pacer)
	return d, nil
}

// startFiles is what validate read: everything Start needs from files.
type startFiles struct {
	policies *config.Source
	sealer   idem.Sealer
	// creds are the ext_proc listener's TLS credentials; nil without TLS.
	creds credentials.TransportCredentials
}

// validate reads every file the configuration names, in the order a reader
// of the flags would check them: the admin token, the key ring, the
// policies (which may need the ring), the listener's TLS files and the
// Redis TLS files. It opens nothing that needs closing; each error wraps
// ErrConfig and names its flag. reloaded is told of every reload of the
// key ring and the listener's TLS files, as the policy file's are.
func validate(cfg Config, log *slog.Logger, reloaded func(error)) (startFiles, error) {
	var f startFiles
	if cfg.AdminTokenFile != "" {
		if _, err := admin.ReadToken(cfg.AdminTokenFile); err != nil {
			return f, fmt.Errorf("%w: --admin-token-file: %w", ErrConfig, err)
		}
	}
	var ring *seal.Ring
	if cfg.EncryptionKeysFile != "" {
		var err error
		if ring, err = seal.LoadRing(cfg.EncryptionKeysFile, log); err != nil {
			return f, fmt.Errorf("%w: --encryption-keys-file: %w", ErrConfig, err)
		}
		ring.OnReload(reloaded)
		f.sealer = ring
	}
	needsRing := func(set *policy.Set) error {
		for _, p := range set.Policies {
			if p.Encrypt && ring == nil {
				return fmt.Errorf("policy %q has encrypt: true but the server has no --encryption-keys-file", p.Name)
			}
		}
		return nil
	}
	var err error
	if f.policies, err = config.NewSource(cfg.ConfigFile, log, needsRing); err != nil {
		return f, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.TLSCertFile != "" {
		ts, err := tlsfiles.NewServer(tlsfiles.Files{
			Cert: cfg.TLSCertFile, Key: cfg.TLSKeyFile, ClientCA: cfg.TLSClientCAFile, AllowedSANs: cfg.TLSAllowedSANs,
		}, log)
		if err != nil {
			return f, fmt.Errorf("%w: --tls-cert-file, --tls-key-file, --tls-client-ca-file: %w", ErrConfig, err)
		}
		ts.OnReload(reloaded)
		f.creds = credentials.NewTLS(ts.Config())
	}
	return f, checkRedisFiles(cfg.RedisSecurity)
}

// checkRedisFiles loads the Redis CA bundle and client certificate, each
// error naming its flags.
func checkRedisFiles(sec redisstore.Security) error {
	if err := (redisstore.Security{CAFile: sec.CAFile}).CheckFiles(); err != nil {
		return fmt.Errorf("%w: --redis-ca-file: %w", ErrConfig, err)
	}
	if err := (redisstore.Security{CertFile: sec.CertFile, KeyFile: sec.KeyFile}).CheckFiles(); err != nil {
		return fmt.Errorf("%w: --redis-cert-file, --redis-key-file: %w", ErrConfig, err)
	}
	return nil
}

// newTracerProvider is observe.NewTracerProvider; tests replace it to see
// that a failed start shuts tracing down.
var newTracerProvider = observe.NewTracerProvider

// open opens tracing, the store and the listeners, pushing each onto the
// cleanup stack as soon as it is open. It returns the tracer provider, nil
// when tracing is off.
func (d *Daemon) open(getenv func(string) string) (trace.TracerProvider, error) {
	tp, shutdownTracing, err := newTracerProvider(context.Background(), getenv)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	d.cleanup.push(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = shutdownTracing(ctx)
		cancel()
	})
	if observe.TracingEnabled(getenv) {
		d.log.Info("tracing: exporting spans over OTLP as the OTEL_* environment says")
	} else {
		// No provider at all: the server and the store then skip span
		// work, which even a no-op provider costs (a context per span).
		tp = nil
	}
	if err := d.openStore(); err != nil {
		return nil, err
	}
	// With the store open and no port yet: a store that lacks a capability
	// the policies need (wait_for_in_flight needs Watch) is refused now, and
	// a reload that would need one is refused later, rather than the
	// capability failing request by request.
	if err := d.policies.Current().CheckStore(d.store); err != nil {
		return nil, fmt.Errorf("%w: --config: %w", ErrConfig, err)
	}
	d.policies.AlsoCheck(func(set *policy.Set) error { return set.CheckStore(d.store) })
	if err := d.openRegions(); err != nil {
		return nil, err
	}
	if d.lis, err = net.Listen("tcp", d.cfg.Listen); err != nil {
		return nil, fmt.Errorf("--listen %s: %w", d.cfg.Listen, err)
	}
	d.cleanup.push(func() { _ = d.lis.Close() })
	if d.cfg.AdminListen != "" {
		if d.adminLis, err = net.Listen("tcp", d.cfg.AdminListen); err != nil {
			return nil, fmt.Errorf("--admin-listen %s: %w", d.cfg.AdminListen, err)
		}
		d.cleanup.push(func() { _ = d.adminLis.Close() })
	}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	d.watchCtx, d.stopWatch = watchCtx, stopWatch
	d.cleanup.push(stopWatch)
	return tp, nil
}

// openStore opens the in-memory store or the Redis client and store, and
// for Redis checks its settings.
func (d *Daemon) openStore() error {
	if d.cfg.RedisURL == "" {
		d.log.Warn("no --redis-url: using the in-memory store; records live in this process only, " +
			"so run exactly one replica and expect them to vanish on restart")
		ms := memstore.New(memstore.Options{MaxRecords: d.cfg.MemoryMaxRecords})
		d.store = ms
		d.cleanup.push(func() { _ = ms.Close() })
		return nil
	}
	rdb, err := redisstore.NewSecureClient(d.cfg.RedisURL, d.cfg.StoreTimeout, d.cfg.RedisSecurity)
	if err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	d.cleanup.push(func() { _ = rdb.Close() })
	// The round trip, measured once: it chooses the batching here and is
	// checked against --store-timeout with --region (openRegions).
	pctx, pcancel := context.WithTimeout(context.Background(), 5*time.Second)
	d.ownRTT, d.ownRTTErr = d.probeRTT(pctx, d.cfg.RedisURL)
	pcancel()
	opts := d.batchingAt(d.ownRTT, d.ownRTTErr == nil, "")
	opts.CallTimeout = d.cfg.StoreTimeout
	opts.Logger = d.log
	st := redisstore.New(rdb, opts)
	d.store = st
	d.cleanup.push(func() { _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := d.store.Ping(ctx); err != nil {
		// Not fatal: Redis may come up later; /readyz tells until then.
		d.log.Warn("redis does not answer yet; not ready until it does", slog.String("error", err.Error()))
	}
	return d.checkStoreAtStart(st)
}

// serve wires the server over what open opened and starts serving; it
// cannot fail.
func (d *Daemon) serve(files startFiles, tp trace.TracerProvider, pacer *bodyPacer) {
	d.metrics.KnowPolicies(policyNames(d.policies.Current()))
	d.policies.OnReload = func(err error) {
		d.metrics.ConfigReloaded(err)
		if err == nil {
			d.metrics.KnowPolicies(policyNames(d.policies.Current()))
		}
		d.reloaded(err)
	}
	if err := d.policies.Watch(d.watchCtx); err != nil {
		d.log.Warn("configuration file not watched; reload with SIGHUP", slog.String("error", err.Error()))
	}
	d.reloadOnHangup(d.watchCtx)
	budget := d.cfg.MaxBufferedBytes
	if budget == 0 {
		budget = defaultMaxBufferedBytes(os.ReadFile)
	}
	var onSmallBody func()
	if pacer != nil {
		onSmallBody = func() { pacer.pace() }
	}
	d.grpc, d.store, d.ext = server.New(server.Config{
		Config: extproc.Config{
			Store: d.store, TracerProvider: tp, Policies: d.policies.Current, Logger: d.log,
			StoreTimeout: d.cfg.StoreTimeout, MaxBufferedBytes: budget, Sealer: files.sealer,
			Homes: d.homes(), SendHome: d.cfg.RegionSendHome, MaxMessageTimeout: d.cfg.EnvoyMaxMessageTimeout,
			OnSmallBody: onSmallBody,
		},
		Metrics: d.metrics, MaxMessageSize: d.cfg.MaxMessageSize, Creds: files.creds, Keepalive: d.cfg.Keepalive,
	})
	if pacer != nil {
		pacer.track(d.ext.BufferedBytes)
	}
	if d.router != nil {
		d.router.UseLocal(d.store) // instrumented now
	}
	d.health = health.NewServer()
	healthpb.RegisterHealthServer(d.grpc, d.health)
	d.checkHealth(d.watchCtx)
	if d.safety != nil {
		d.safety.watch(d.watchCtx)
	}
	d.keepRegionsWarm(d.watchCtx)
	go func() { d.errc <- d.grpc.Serve(d.lis) }()
	if d.adminLis != nil {
		d.admin = &http.Server{Handler: d.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := d.admin.Serve(d.adminLis); !errors.Is(err, http.ErrServerClosed) {
				d.errc <- err
			}
		}()
	}
	d.log.Info("idem-extproc serving", slog.String("listen", d.lis.Addr().String()),
		slog.String("admin_listen", d.AdminAddr()), slog.String("store", d.storeName()),
		slog.String("config", d.cfg.ConfigFile), slog.Int("policies", len(d.policies.Current().Policies)),
		slog.Int64("max_buffered_bytes", budget))
}

// cleanupStack holds what Start opened, to be closed newest first: on a
// failed start, and at the end of Shutdown.
type cleanupStack []func()

func (c *cleanupStack) push(f func()) { *c = append(*c, f) }

// unwind runs the cleanups newest first, each once.
func (c *cleanupStack) unwind() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

func policyNames(set *policy.Set) []string {
	names := make([]string, 0, len(set.Policies))
	for _, p := range set.Policies {
		names = append(names, p.Name)
	}
	return names
}

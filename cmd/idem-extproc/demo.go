package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/demoorders"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// Settings of the demo's Envoy-like front, those of envoy/envoy.yaml: the
// filter's message_timeout and max_message_timeout, and the route timeout.
const (
	demoMessageTimeout    = 300 * time.Millisecond
	demoMaxMessageTimeout = 2500 * time.Millisecond
	demoRouteTimeout      = 10 * time.Second
)

// The routes of envoy/envoy.yaml's orders virtual host, which the demo's
// front has too: reads go by orders-read, where the ext_proc filter is
// disabled, everything else by orders-write.
const (
	demoReadRoute  = "orders-read"
	demoWriteRoute = "orders-write"
)

// demoArrivedLine is what the demo writes to stderr when a POST reaches the
// demo upstream (so a retry sent after it meets a reservation).
const demoArrivedLine = "demo upstream: POST /orders arrived"

// demoFlags are the demo's flags. Those that are also the server's are
// handed to it as they are, so that it checks, loads and reloads them as
// it always does.
type demoFlags struct {
	addr, logLevel string
	config         string
	redisURL       string
	adminTokenFile string
	keysFile       string
	storeTimeout   string
	upstream       string
}

func demoCommand(e env) *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo [flags]",
		Short: "Try it without Docker: the server, an Envoy-like front and a demo upstream on loopback",
		Long: "Start, on loopback and in this one process, the server, an Envoy-like HTTP front that runs every\n" +
			"request through it with this project's own ext_proc client (internal/testing/envoysim, with the filter settings\n" +
			"and routes of envoy/envoy.yaml), and demo-orders, an orders API whose counter shows how many orders\n" +
			"were really created (or, with --upstream, your own API).\n\n" +
			"It prints, for each policy in force, what it matches and how it keys, scopes and keeps requests, with\n" +
			"curl commands that show a replay through the front and, with --admin-token-file, the idem-extproc admin\n" +
			"commands that look the record up and purge it. With --config it prints them again each time the\n" +
			"policy file changes (or says why the change was rejected). Without --config and --upstream it first\n" +
			"prints the commands that show a replay, a 422, a 409 and an unknown outcome. It serves until interrupted; nothing here is\n" +
			"for production.",
		Example: "  idem-extproc demo\n" +
			"  idem-extproc demo --config policies.yaml --admin-token-file token --redis-url redis://localhost:6379/0\n" +
			"  idem-extproc demo --config policies.yaml --upstream http://127.0.0.1:3000",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), e, f)
		},
	}
	server := daemon.Flags()
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:8080", "address of the Envoy-like front the curl commands use (127.0.0.1:0 picks a free port)")
	fl.StringVar(&f.logLevel, "log-level", "warn", "the server's log level: debug, info (a line per decision), warn or error")
	fl.StringVar(&f.config, "config", "", "the server's "+server.Lookup("config").Usage)
	fl.StringVar(&f.redisURL, "redis-url", "", "the server's "+server.Lookup("redis-url").Usage)
	fl.StringVar(&f.adminTokenFile, "admin-token-file", "", "the server's "+server.Lookup("admin-token-file").Usage+
		" (with it, the demo prints the idem-extproc admin commands that use it)")
	fl.StringVar(&f.keysFile, "encryption-keys-file", "", "the server's "+server.Lookup("encryption-keys-file").Usage)
	fl.StringVar(&f.storeTimeout, "store-timeout", server.Lookup("store-timeout").DefValue, "the server's "+server.Lookup("store-timeout").Usage)
	fl.StringVar(&f.upstream, "upstream", "", "the API the front sends requests to, http://host:port (no path); empty: demo-orders")
	return cmd
}

// serverArgs are the server's flags for the demo's settings.
func (f demoFlags) serverArgs() []string {
	args := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--log-format", "text", "--log-level", f.logLevel, "--drain-timeout", "2s"}
	for _, a := range []struct{ flag, value string }{{"config", f.config}, {"redis-url", f.redisURL}, {"admin-token-file", f.adminTokenFile},
		{"encryption-keys-file", f.keysFile}, {"store-timeout", f.storeTimeout}} {
		if a.value != "" {
			args = append(args, "--"+a.flag, a.value)
		}
	}
	return args
}

// demoUpstream is the demo's own orders upstream, served on a loopback port.
type demoUpstream struct {
	*http.Server
	addr string
}

// serveDemoUpstream serves the orders upstream (demoorders), which says on
// stderr when a POST reaches it (demoArrivedLine).
func serveDemoUpstream(e env) (demoUpstream, error) {
	orders := &demoorders.Server{MaxDelay: demoRouteTimeout / 2}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return demoUpstream{}, err
	}
	up := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/orders" {
			fmt.Fprintln(e.stderr, demoArrivedLine)
		}
		orders.Handler().ServeHTTP(w, r)
	})}
	go func() { _ = up.Serve(lis) }()
	return demoUpstream{Server: up, addr: lis.Addr().String()}, nil
}

// demoProxy is the Envoy-like front: envoysim's ext_proc client over cc,
// with the filter settings of envoy/envoy.yaml, its routes, and a router
// to upstream.
func demoProxy(cc *grpc.ClientConn, upstream *url.URL) *envoysim.Proxy {
	// The client never sends a request again on its own, as Envoy's router
	// does not without a retry policy (envoy/envoy.yaml sets none on
	// writes): net/http's Transport resends a request that carries an
	// Idempotency-Key when a reused connection closes before the answer
	// (net/http/transport.go, persistConn.shouldRetryRequest; request.go,
	// Request.isReplayable), which would run twice a POST whose answer was
	// lost. A connection per request is never a reused one. No proxy
	// either: Envoy reads no HTTP_PROXY.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	filterCfg := envoysim.RecommendedConfig()
	filterCfg.MessageTimeout = durationpb.New(demoMessageTimeout)
	filterCfg.MaxMessageTimeout = durationpb.New(demoMaxMessageTimeout)
	return &envoysim.Proxy{
		Filter:   envoysim.NewFilter(cc, filterCfg, envoysim.Options{}),
		Upstream: envoysim.HTTPUpstream(client, upstream, demoRouteTimeout),
		Route:    demoRoute,
	}
}

func runDemo(ctx context.Context, e env, f demoFlags) error {
	upstream, err := demoUpstreamURL(f.upstream)
	if err != nil {
		fmt.Fprintf(e.stderr, "idem-extproc demo: --upstream: %v\n", err)
		return exitUsage
	}
	// The server, as `idem-extproc --listen 127.0.0.1:0 ...` would run it,
	// without the caller's IDEM_* environment: only the demo's own flags
	// reach it, checked as the server checks them.
	cfg, err := daemon.ParseConfig(f.serverArgs(), func(string) string { return "" }, e.stderr)
	if err != nil {
		fmt.Fprintf(e.stderr, "idem-extproc demo: %v\n", err)
		return exitUsage
	}
	log := daemon.NewLogger(cfg, e.stderr)
	d, err := daemon.Start(cfg, log, func(string) string { return "" })
	if errors.Is(err, daemon.ErrConfig) {
		fmt.Fprintf(e.stderr, "idem-extproc demo: %v\n", err)
		return exitUsage
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "idem-extproc demo: %v\n", err)
		return exitFailure
	}
	defer d.Shutdown()

	if upstream == nil {
		up, err := serveDemoUpstream(e)
		if err != nil {
			return err
		}
		defer up.Close()
		upstream = &url.URL{Scheme: "http", Host: up.addr}
	}

	// The Envoy-like front: envoysim's ext_proc client with the filter and
	// the routes of envoy/envoy.yaml, and a router to the upstream.
	cc, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	proxy := demoProxy(cc, upstream)
	frontLis, err := net.Listen("tcp", f.addr)
	if err != nil {
		fmt.Fprintf(e.stderr, "idem-extproc demo: --addr %s: %v\n", f.addr, err)
		return exitFailure
	}
	front := &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- front.Serve(frontLis) }()
	defer front.Close()

	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the path of this binary, for the printed commands: %w", err)
	}
	_, err = os.Stat(filepath.Join("cmd", "idem-extproc", "main.go"))
	p := &demoPrinter{
		w: e.stdout, front: frontLis.Addr().String(), admin: d.AdminAddr(), run: runID(),
		self: demoSelf(os.Args[0], exe, err == nil),
		// Absolute, so that the printed commands work from any directory.
		config: absPath(f.config), redisURL: f.redisURL, tokenFile: absPath(f.adminTokenFile), upstream: f.upstream,
	}
	// Told first, read after: a reload in between is printed twice rather
	// than missed (daemon.Daemon.OnReload).
	d.OnReload(p.reloaded)
	p.start(d.Policies())
	select {
	case <-ctx.Done():
		fmt.Fprintln(e.stderr, "idem-extproc demo: stopping")
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// demoRoute is the route envoy/envoy.yaml's orders virtual host picks: the
// filter is disabled on orders-read (GET, HEAD and OPTIONS), so reads cost
// no ext_proc stream.
func demoRoute(r *http.Request) (string, *extprocfilterv3.ExtProcPerRoute) {
	if demoReadMethod(r.Method) {
		return demoReadRoute, &extprocfilterv3.ExtProcPerRoute{
			Override: &extprocfilterv3.ExtProcPerRoute_Disabled{Disabled: true},
		}
	}
	return demoWriteRoute, nil
}

// demoReadMethod reports whether envoy/envoy.yaml's orders-read route takes
// method (its ":method" regex ^(GET|HEAD|OPTIONS)$).
func demoReadMethod(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}

// demoUpstreamURL checks --upstream: nil for demo-orders. The front keeps
// each request's own path and query (envoysim.HTTPUpstream), so a path in
// the URL would be dropped silently: it is refused instead.
func demoUpstreamURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q: want http://host:port or https://host:port", s)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("%q: want only a scheme, host and port: each request keeps its own path", s)
	}
	u.Path = ""
	return u, nil
}

// absPath makes path absolute, or leaves it as it is when it cannot (the
// server has read it already, so the working directory exists).
func absPath(path string) string {
	if path == "" {
		return ""
	}
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

// runID tells this run's keys from an earlier run's in a store that kept
// them (Redis): the printed commands would otherwise meet old records.
func runID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b) // it never returns an error (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}

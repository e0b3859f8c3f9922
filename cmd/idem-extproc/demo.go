package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/demoorders"
	"github.com/idem-extproc/idem-extproc/internal/envoysim"
)

// Settings of the demo's Envoy-like front, those of envoy/envoy.yaml: the
// filter's message_timeout and the route timeout.
const (
	demoMessageTimeout = 300 * time.Millisecond
	demoRouteTimeout   = 10 * time.Second
)

// demoArrivedLine is what the demo writes to stderr when a POST reaches the
// demo upstream (so a retry sent after it meets a reservation).
const demoArrivedLine = "demo upstream: POST /orders arrived"

func demoCommand(e env) *cobra.Command {
	var addr, logLevel string
	cmd := &cobra.Command{
		Use:   "demo [flags]",
		Short: "Try it without Docker: the server, an Envoy-like front and a demo upstream on loopback",
		Long: "Start, on loopback and in this one process, the server (in-memory store, default policy), an\n" +
			"Envoy-like HTTP front that runs every request through the server with this project's own ext_proc\n" +
			"client (internal/envoysim, the filter settings of envoy/envoy.yaml), and demo-orders, an orders API\n" +
			"whose counter shows how many orders were really created. It prints the curl commands that show a\n" +
			"replay, a 422 and a 409, and serves until interrupted. Nothing here is for production.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), e, addr, logLevel)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8080", "address of the Envoy-like front the curl commands use (127.0.0.1:0 picks a free port)")
	cmd.Flags().StringVar(&logLevel, "log-level", "warn", "the server's log level: debug, info (a line per decision), warn or error")
	return cmd
}

func runDemo(ctx context.Context, e env, addr, logLevel string) error {
	// The server, as `idem-extproc --listen 127.0.0.1:0 ...` would run it,
	// without the caller's IDEM_* environment: the demo always uses the
	// in-memory store and the default policy.
	cfg, err := daemon.ParseConfig([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--log-format", "text", "--log-level", logLevel, "--drain-timeout", "2s"}, func(string) string { return "" }, e.stderr)
	if err != nil {
		fmt.Fprintf(e.stderr, "idem-extproc demo: %v\n", err)
		return exitUsage
	}
	log := daemon.NewLogger(cfg, e.stderr)
	d, err := daemon.Start(cfg, log, func(string) string { return "" })
	if err != nil {
		fmt.Fprintf(e.stderr, "idem-extproc demo: %v\n", err)
		return exitFailure
	}
	defer d.Shutdown()

	// The demo upstream.
	orders := &demoorders.Server{MaxDelay: demoRouteTimeout / 2}
	upLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	up := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/orders" {
			fmt.Fprintln(e.stderr, demoArrivedLine)
		}
		orders.Handler().ServeHTTP(w, r)
	})}
	go func() { _ = up.Serve(upLis) }()
	defer up.Close()

	// The Envoy-like front: envoysim's ext_proc client, the filter of
	// envoy/envoy.yaml (RecommendedConfig with its message_timeout), and a
	// router to the upstream.
	cc, err := grpc.NewClient(d.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	filterCfg := envoysim.RecommendedConfig()
	filterCfg.MessageTimeout = durationpb.New(demoMessageTimeout)
	base := &url.URL{Scheme: "http", Host: upLis.Addr().String()}
	proxy := &envoysim.Proxy{
		Filter:   envoysim.NewFilter(cc, filterCfg, envoysim.Options{}),
		Upstream: envoysim.HTTPUpstream(http.DefaultClient, base, demoRouteTimeout),
	}
	frontLis, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(e.stderr, "idem-extproc demo: --addr %s: %v\n", addr, err)
		return exitFailure
	}
	front := &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- front.Serve(frontLis) }()
	defer front.Close()

	printDemo(e.stdout, "http://"+frontLis.Addr().String(), d.AdminAddr())
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

// demoSteps are the exchanges the demo prints, in order; TestBinaryDemo
// runs the printed commands.
func demoSteps(front string) []demoStep {
	create := `curl -si -X POST '` + front + `/orders' -H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' -d '{"item":"book","qty":1}'`
	count := `curl -si '` + front + `/orders/count'`
	slow := `curl -si -X POST '` + front + `/orders?delay=3s' -H 'Idempotency-Key: order-2' -H 'Content-Type: application/json' -d '{"item":"pen","qty":1}'`
	return []demoStep{
		{comment: "1. Create an order, then send the same request again: the stored answer, marked\n#    idempotent-replayed: true. The counter shows one order.",
			lines: []string{create, create, count}},
		{comment: "2. Reuse the key for a different request: 422 idempotency-key-reused, nothing created.",
			lines: []string{strings.Replace(create, `"qty":1`, `"qty":2`, 1), count}},
		{comment: "3. Retry while the first attempt still runs (?delay=3s slows the upstream): 409 request-in-progress\n#    with Retry-After: 1; the first attempt completes, and the counter shows two orders.",
			lines: []string{slow + " &", "sleep 1", slow, "wait", count}},
	}
}

type demoStep struct {
	comment string
	lines   []string
}

func printDemo(w io.Writer, front, admin string) {
	fmt.Fprintf(w, "idem-extproc demo: an Envoy-like front on %s runs every request through the idem-extproc server\n", front)
	fmt.Fprintf(w, "(in-memory store, default policy: POST and PATCH with an Idempotency-Key) to demo-orders.\n")
	fmt.Fprintf(w, "The server's /metrics and /readyz are on http://%s. Stop with Ctrl-C. In another terminal:\n\n", admin)
	for _, s := range demoSteps(front) {
		fmt.Fprintf(w, "# %s\n", s.comment)
		for _, l := range s.lines {
			fmt.Fprintln(w, l)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "# ready")
}

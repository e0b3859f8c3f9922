// Command demo-orders is the demo upstream of the docker-compose
// quickstart: a tiny orders API whose order counter makes every executed
// write visible (package demoorders).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/demoorders"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "demo-orders:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. ready, when set, receives the bound address.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("demo-orders", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", demoorders.DefaultAddr, "HTTP listen address")
	maxDelay := fs.Duration("max-delay", demoorders.DefaultMaxDelay, "largest ?delay= accepted")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	srv := &demoorders.Server{MaxDelay: *maxDelay, Log: log}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lis) }()
	log.Info("demo-orders serving", slog.String("listen", lis.Addr().String()))
	if ready != nil {
		ready <- lis.Addr().String()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), *maxDelay+5*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

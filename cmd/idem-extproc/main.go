// Command idem-extproc enforces HTTP idempotency keys for Envoy through the
// ext_proc protocol. See README.md for flags and deployment.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := daemon.Main(ctx, os.Args[1:], os.Getenv, os.Stderr)
	stop()
	os.Exit(code)
}

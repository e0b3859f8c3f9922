// Command idem-extproc enforces HTTP idempotency keys for Envoy through the
// ext_proc protocol. `idem-extproc --help` lists its subcommands and flags;
// README.md has the details.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

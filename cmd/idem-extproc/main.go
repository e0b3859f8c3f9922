// Command idem-extproc enforces HTTP idempotency keys for Envoy through the
// ext_proc protocol. See README.md for flags and deployment.
//
//	idem-extproc [flags]                      run the server
//	idem-extproc admin get|purge|resolve ...  act on records through a server's admin API
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idem-extproc/idem-extproc/internal/admin"
	"github.com/idem-extproc/idem-extproc/internal/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	var code int
	if len(os.Args) > 1 && os.Args[1] == "admin" {
		code = admin.RunCLI(ctx, os.Args[2:], os.Getenv, os.Stdout, os.Stderr)
	} else {
		code = daemon.Main(ctx, os.Args[1:], os.Getenv, os.Stderr)
	}
	stop()
	os.Exit(code)
}

// Command idem-loadtest measures idem-extproc under load against two
// reference servers, in the same run and through the same Envoy-faithful
// driver. See docs/performance.md.
//
//	idem-loadtest [flags]          measure (idem-loadtest --help)
//	idem-loadtest memory [flags]   Redis memory per record
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idem-extproc/idem-extproc/tools/internal/loadtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := loadtest.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

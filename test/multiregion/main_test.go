package multiregion_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// quiet drops go-redis's own log lines: the bed kills and cuts stores on
// purpose, and the clients' redial complaints would bury the test's.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	os.Exit(m.Run())
}

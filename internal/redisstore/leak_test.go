package redisstore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them:
// the Redis batcher's flushers, the watch hub's subscription and the clients' pools must all end when what started them is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

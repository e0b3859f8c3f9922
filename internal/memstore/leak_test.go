package memstore

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them:
// the expiry sweeper must all end when what started them is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

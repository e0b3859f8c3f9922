package daemon

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them:
// the asynchronous log writer, the listeners, the reload loops and the stores it opens must all end when what started them is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

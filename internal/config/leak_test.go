package config

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests when a goroutine outlives them:
// the policy file watcher (Source) must all end when what started them is closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

//go:build race

package extproc

import (
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/norace"
)

// TestHeaderCopiesAllocateOnce counts allocations, which the race
// detector changes, so a race-built binary runs it (headers_alloc_test.go)
// in one built without the detector.
func TestHeaderCopiesAllocateOnce(t *testing.T) { norace.Run(t, "TestHeaderCopiesAllocateOnce") }

package observe

import (
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// BenchmarkRequestMetrics times the metric updates of one protected first
// write (its request, decision and two store calls): each runs on the
// request path.
func BenchmarkRequestMetrics(b *testing.B) {
	m := NewMetrics()
	m.KnowPolicies([]string{"orders"})
	b.ReportAllocs()
	for b.Loop() {
		m.Requested("orders", true)
		m.Decided("orders", idem.DecisionReserved)
		m.ObserveStoreCall("reserve", "ok", time.Millisecond)
		m.ObserveStoreCall("complete", "ok", time.Millisecond)
		m.Decided("orders", idem.DecisionStored)
	}
}

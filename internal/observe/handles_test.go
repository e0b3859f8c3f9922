package observe

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// exposition is the /metrics page without the Go runtime and process
// collectors' series (they differ between two registries of one process).
func exposition(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	var kept []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.Contains(line, " go_") || strings.HasPrefix(line, "go_") ||
			strings.Contains(line, " process_") || strings.HasPrefix(line, "process_") {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n")
}

// TestCachedSeriesExposeWhatWithLabelValuesExposes: the same traffic
// through Metrics' methods (the cached series) and straight through the
// vectors' WithLabelValues (the code before the cache) gives the same
// /metrics page byte for byte: the same series, created at the same event,
// with the same values, for policies known and unknown, the empty policy,
// and more label values than the cache keeps.
func TestCachedSeriesExposeWhatWithLabelValuesExposes(t *testing.T) {
	cached, direct := NewMetrics(), NewMetrics()
	cached.KnowPolicies([]string{"orders"})
	direct.KnowPolicies([]string{"orders"})
	policies := []string{"orders", "", "payments", "ünïcode"}
	for i := range 3*maxCachedSeries + 50 {
		p := policies[i%len(policies)]
		if i > 40 {
			p = fmt.Sprintf("p%d", i) // past the cache's bound
		}
		d := []idem.Decision{idem.DecisionReserved, idem.DecisionReplayed, idem.DecisionStored}[i%3]
		took := time.Duration(i%7) * 300 * time.Microsecond
		result := []string{"ok", "timeout", "not_found"}[i%3]
		cached.Requested(p, i%2 == 0)
		cached.Decided(p, d)
		cached.ObserveStoreCall("reserve", result, took)
		cached.Replayed(p, took*1000)
		cached.ShadowDecided(p, idem.ShadowDecision("would_replay"))

		key := map[bool]string{true: "present", false: "absent"}[i%2 == 0]
		direct.requests.WithLabelValues(policyLabel(p), key).Inc()
		direct.decisions.WithLabelValues(policyLabel(p), string(d)).Inc()
		direct.storeCalls.WithLabelValues("reserve", result).Observe(took.Seconds())
		direct.replayAge.WithLabelValues(policyLabel(p)).Observe((took * 1000).Seconds())
		direct.shadow.WithLabelValues(policyLabel(p), "would_replay").Inc()
		if i == 10 {
			if a, b := exposition(t, cached), exposition(t, direct); a != b {
				t.Fatalf("after 11 requests the pages differ\ncached:\n%s\ndirect:\n%s", a, b)
			}
		}
	}
	if a, b := exposition(t, cached), exposition(t, direct); a != b {
		t.Fatalf("the pages differ\ncached:\n%s\ndirect:\n%s", a, b)
	}
	if n := len(*cached.decisionSeries.series.Load()); n != maxCachedSeries {
		t.Fatalf("%d decision series cached, want the bound %d", n, maxCachedSeries)
	}
}

// TestCachedSeriesUnderConcurrentUse: streams adding new label values
// while others count lose no increment (run with -race).
func TestCachedSeriesUnderConcurrentUse(t *testing.T) {
	m := NewMetrics()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				m.Decided(fmt.Sprintf("p%d", (g+i)%20), idem.DecisionReserved)
			}
		})
	}
	wg.Wait()
	page := exposition(t, m)
	total := 0
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, "idem_extproc_decisions_total{") && strings.Contains(line, `decision="reserved"`) {
			var n int
			_, _ = fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &n)
			total += n
		}
	}
	if total != 8*500 {
		t.Fatalf("%d reserved decisions counted, want %d", total, 8*500)
	}
}

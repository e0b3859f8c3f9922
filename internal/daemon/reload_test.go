package daemon_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// reloadPolicies is a policy file ending with the end marker; %s is the
// policy's name. Both versions require keys on /orders, scope them by the
// x-tenant header, and protect nothing else: a request that sees any
// other set (a cut copy) shows it as a keyless pass, a replay across
// tenants, or a policy label other than these two.
const reloadPolicies = `# orders, by tenant
defaults:
  retention: 1h
  lease: 10s
policies:
  - name: %s
    match:
      methods: [POST]
      path:
        prefix: /orders
    key:
      required: true
    scope:
      from: header
      header: x-tenant
default_policy:
  enabled: false
...
`

// TestReloadOfCutFilesWhileRequestsFlow writes prefixes of a new policy
// file in place (every line boundary and a random sample of other cuts),
// reloading after each as SIGHUP does while the file watcher races it,
// with requests flowing throughout; then the whole file. No request may see
// a policy set other than the old or the new one, and every cut is a
// rejected reload, counted and logged.
func TestReloadOfCutFilesWhileRequestsFlow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(reloadPolicies, "orders-v1")), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "--config", path)
	newFile := []byte(fmt.Sprintf(reloadPolicies, "orders-v2"))

	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	fail := func(format string, args ...any) {
		mu.Lock()
		bad = append(bad, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for w := range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				if rep := r.env.Post("/orders", "", `{}`, "x-tenant", "a"); rep.Status != http.StatusBadRequest {
					fail("keyless POST /orders = %d %s", rep.Status, rep.Body)
				}
				key := fmt.Sprintf("k-%d-%d", w, i)
				for _, tenant := range []string{"a", "b"} {
					rep := r.env.Post("/orders", key, `{}`, "x-tenant", tenant)
					if rep.Err != nil || rep.Status >= 300 || rep.Header.Get("Idempotent-Replayed") != "" {
						fail("POST /orders %s for tenant %s = %d %v replayed=%q", key, tenant, rep.Status, rep.Err, rep.Header.Get("Idempotent-Replayed"))
					}
				}
				_ = r.env.Post("/other", key, `{}`)
			}
		})
	}

	rejected := 0
	for _, n := range prefixLengths(newFile) {
		if err := os.WriteFile(path, newFile[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := r.d.Reload(); err != nil {
			rejected++
		} else if n < len(newFile)-1 {
			t.Errorf("a cut of %d bytes (of %d) was applied", n, len(newFile))
		}
	}
	if err := os.WriteFile(path, newFile, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err != nil { // nil too when the watcher was first
		t.Fatalf("the whole new file: %v", err)
	}
	testwait.For(t, func() bool {
		return strings.Contains(scrape(t, r.d), `idem_extproc_requests_total{key="present",policy="orders-v2"}`)
	})
	stop.Store(true)
	wg.Wait()

	for _, b := range bad {
		t.Error(b)
	}
	m := scrape(t, r.d)
	for _, l := range regexp.MustCompile(`idem_extproc_requests_total\{[^}]*policy="([^"]*)"`).FindAllStringSubmatch(m, -1) {
		if l[1] != "orders-v1" && l[1] != "orders-v2" {
			t.Errorf("a request was matched by policy %q, of neither file", l[1])
		}
	}
	if rejected == 0 {
		t.Fatal("no cut was rejected: the test tried none")
	}
	n, _ := fmt.Sscan(metricValue(m, `idem_extproc_config_reloads_total{result="rejected"}`), new(float64))
	if n != 1 {
		t.Error("rejected reloads are not counted")
	}
	if !strings.Contains(r.logs.String(), "configuration reload rejected") {
		t.Error("rejected reloads are not logged")
	}
}

// prefixLengths returns every line boundary of b and a few other cuts,
// all shorter than b.
func prefixLengths(b []byte) []int {
	var out []int
	for i, c := range b[:len(b)-1] {
		if c == '\n' {
			out = append(out, i+1)
		}
	}
	r := rand.New(rand.NewPCG(1, 15))
	for range 20 {
		out = append(out, r.IntN(len(b)-1))
	}
	return out
}

// TestAlertedSeriesExistFromStart: the counters the alert rules read are
// exposed at 0 before any event, per policy in force, and a policy a
// reload adds gets its own (observability/prometheus-rules.yaml).
func TestAlertedSeriesExistFromStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(fmt.Sprintf(reloadPolicies, "orders-v1")), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "--config", path)
	m := scrape(t, r.d)
	for _, s := range []string{
		`idem_extproc_config_reloads_total{result="rejected"}`,
		`idem_extproc_config_reloads_total{result="ok"}`,
		`idem_extproc_settle_failures_total{decision="stored",policy="orders-v1"}`,
		`idem_extproc_decisions_total{decision="fail_open",policy="orders-v1"}`,
		`idem_extproc_store_call_duration_seconds_count{op="reserve",result="error"}`,
	} {
		if v := metricValue(m, s); v != "0" {
			t.Errorf("%s = %q at start, want 0", s, v)
		}
	}
	if err := os.WriteFile(path, []byte(fmt.Sprintf(reloadPolicies, "orders-v2")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool {
		return metricValue(scrape(t, r.d), `idem_extproc_settle_failures_total{decision="stored",policy="orders-v2"}`) == "0"
	})
}

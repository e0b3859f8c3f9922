package daemon

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// TestRegionFlagMistakes: each mistake in the region flags is named at
// parse time, all at once.
func TestRegionFlagMistakes(t *testing.T) {
	_, err := ParseConfig([]string{"--region-redis", "us=redis://a:1 bogus", "--store-timeout", "1h"},
		func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `"bogus" is not name=redis-url`) {
		t.Fatalf("bad pair: %v", err)
	}
	_, err = ParseConfig([]string{"--region-redis", "us=redis://a:1", "--region-send-home", "us", "--store-timeout", "1h"},
		func(string) string { return "" }, io.Discard)
	for _, want := range []string{"--region-redis: needs --region", "--region-send-home: needs --region", "--store-timeout: 1h0m0s is above 10s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
	_, err = ParseConfig([]string{"--region", "eu", "--region-redis", "us=redis://a:1", "--region-send-home", "us,ap"},
		func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `--region-send-home: "ap" is not a region of --region-redis`) {
		t.Errorf("a region to send home to without a store: %v", err)
	}
	_, err = ParseConfig([]string{"--region", "EU", "--region-redis", "EU=redis://a:1"},
		func(string) string { return "" }, io.Discard)
	for _, want := range []string{`--region: "EU" is not a region name`, `--region-redis: names this server's own region "EU"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
	cfg, err := ParseConfig(nil, func(k string) string {
		return map[string]string{"IDEM_REGION": "eu", "IDEM_REGION_REDIS": "us=redis://a:1 ap=redis://b:2"}[k]
	}, io.Discard)
	if err != nil || cfg.Region != "eu" || cfg.RegionRedis["us"] != "redis://a:1" || cfg.RegionRedis["ap"] != "redis://b:2" {
		t.Fatalf("from the environment: %+v, %v", cfg.RegionRedis, err)
	}
}

// TestHomesNeedTheirRegions: a policy file with homes is refused at start
// on a server without --region, and when it names a region the server has
// no store for; a reload that would do either is refused and the map in
// force stays.
func TestHomesNeedTheirRegions(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	file := filepath.Join(t.TempDir(), "policies.yaml")
	write := func(homes string) {
		t.Helper()
		if err := os.WriteFile(file, []byte("policies: []\n"+homes), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := func(extra ...string) (*Daemon, error) {
		args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--redis-url", redis.URL(), "--config", file}, extra...)
		cfg, err := ParseConfig(args, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string) string { return "" })
		if err == nil {
			t.Cleanup(d.Shutdown)
		}
		return d, err
	}
	write("homes: {epoch: 1, default: eu, rules: [{scopes: [acme], region: us}]}\n")
	if _, err := start(); err == nil || !strings.Contains(err.Error(), "no --region") || !errors.Is(err, ErrConfig) {
		t.Errorf("homes without --region: %v, want a configuration error (exit 2)", err)
	}
	if _, err := start("--region", "eu"); err == nil || !strings.Contains(err.Error(), `region "us" has no store`) {
		t.Errorf("homes naming an unknown region: %v", err)
	}
	other := redistest.Start(t, redistest.Options{})
	// A budget below two round trips to the own store can never be met.
	if _, err := start("--region", "eu", "--region-redis", "us="+other.URL(), "--store-timeout", "1us"); err == nil ||
		!strings.Contains(err.Error(), "--store-timeout 1µs is below two round trips") {
		t.Errorf("a budget below the round trip: %v", err)
	}
	d, err := start("--region", "eu", "--region-redis", "us="+other.URL())
	if err != nil {
		t.Fatal(err)
	}
	write("homes: {epoch: 2, default: eu, rules: [{scopes: [acme], region: ap}]}\n")
	if err := d.Reload(); err == nil || !strings.Contains(err.Error(), `region "ap" has no store`) {
		t.Errorf("reload naming an unknown region: %v", err)
	}
	if h := d.Policies().Homes; h == nil || h.Epoch != 1 {
		t.Errorf("after a refused reload the map in force is %+v", h)
	}
	write("homes: {epoch: 3, default: eu, rules: [{scopes: [acme], region: us}]}\n")
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	write("homes: {epoch: 2, default: us}\n")
	if err := d.Reload(); err == nil || !strings.Contains(err.Error(), "homes.epoch: 2 is smaller than the epoch in force, 3") {
		t.Errorf("reload with a smaller epoch: %v", err)
	}
	if h := d.Policies().Homes; h == nil || h.Epoch != 3 {
		t.Errorf("after a smaller epoch the map in force is %+v", h)
	}
}

// TestScriptsReachEveryRegion: a region whose Redis does not answer at
// start gets the scripts once it does, loaded in the background and
// counted.
func TestScriptsReachEveryRegion(t *testing.T) {
	redis, other := redistest.Start(t, redistest.Options{}), redistest.Start(t, redistest.Options{})
	link := redistest.NewDelayLink(t, other.Addr())
	link.Hold(true, true)
	cfg, err := ParseConfig([]string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--redis-url", redis.URL(),
		"--region", "eu", "--region-redis", "us=" + link.URL(), "--region-ping-interval", "100ms"},
		func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Shutdown)
	loads := func(result string) float64 {
		mfs, err := d.Metrics().Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "idem_extproc_region_script_loads_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				if labels["region"] == "us" && labels["result"] == result {
					return m.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	if n := loads("ok"); n != 0 {
		t.Fatalf("loaded %v times through a held link", n)
	}
	link.Release()
	testwait.Until(t, "the scripts loaded into us", func() bool { return loads("ok") == 1 })
}

// TestOutOfReachFlaggedAtStart: a home whose calls cannot fit in what
// Envoy grants one message (--envoy-max-message-timeout) is named at
// start, with the flag to change.
func TestOutOfReachFlaggedAtStart(t *testing.T) {
	redis, other := redistest.Start(t, redistest.Options{}), redistest.Start(t, redistest.Options{})
	file := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(file, []byte("policies: []\nhomes: {epoch: 1, default: eu, rules: [{scopes: [acme], region: us}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig([]string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--redis-url", redis.URL(), "--config", file,
		"--region", "eu", "--region-redis", "us=" + other.URL(), "--envoy-max-message-timeout", "150ms"},
		func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedLog{}
	d, err := Start(cfg, slog.New(slog.NewTextHandler(logs, nil)), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Shutdown)
	if out := logs.String(); !strings.Contains(out, "cannot reach within Envoy's timers") || !strings.Contains(out, "homes=us") {
		t.Errorf("no warning naming us:\n%s", out)
	}
}

// lockedLog takes log lines from any goroutine.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestHelpNamesMetricsAsServed: a metric --help names is one /metrics
// serves: every name carries the idem_extproc_ namespace.
func TestHelpNamesMetricsAsServed(t *testing.T) {
	var usage strings.Builder
	_, _ = ParseConfig([]string{"-h"}, func(string) string { return "" }, &usage)
	for _, name := range regexp.MustCompile(`\bidem_[a-z_]+`).FindAllString(usage.String(), -1) {
		if !strings.HasPrefix(name, "idem_extproc_") {
			t.Errorf("--help names %s; /metrics serves idem_extproc_…", name)
		}
	}
	if !strings.Contains(usage.String(), "idem_extproc_region_store_rtt_seconds") {
		t.Error("--help does not name the round-trip metric")
	}
}

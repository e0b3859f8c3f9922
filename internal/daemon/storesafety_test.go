package daemon_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// startOn starts the daemon on a Redis, returning its log.
func startOn(t *testing.T, redis *redistest.Server, extra ...string) (*daemon.Daemon, *harness.LogBuffer) {
	t.Helper()
	args := append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--redis-url", redis.URL()}, extra...)
	cfg, err := daemon.ParseConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &harness.LogBuffer{}
	d, err := daemon.Start(cfg, slog.New(slog.NewJSONHandler(logs, nil)), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Shutdown)
	return d, logs
}

// TestEvictingRedisRefusesTheStart: on a Redis whose maxmemory-policy may
// evict (volatile-lru, a managed default, evicts records: they all have a
// TTL) the binary exits 2 naming the setting and the flag; with
// --allow-evicting-redis it starts, warns, and the gauge says so.
func TestEvictingRedisRefusesTheStart(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory-policy", "volatile-lru"}})
	// Main points go-redis's process-wide logger at stderr: a buffer safe
	// for the writes that may come after it returns.
	stderr := &harness.LogBuffer{}
	code := daemon.Main(context.Background(), []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--redis-url", redis.URL()}, func(string) string { return "" }, stderr)
	if code != 2 {
		t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{"maxmemory-policy volatile-lru", redis.Addr(), "noeviction", "--allow-evicting-redis"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not name %q:\n%s", want, stderr.String())
		}
	}

	d, logs := startOn(t, redis, "--allow-evicting-redis")
	if v := metricValue(scrape(t, d), `idem_extproc_store_node_evicting{node="`+redis.Addr()+`"}`); v != "1" {
		t.Fatalf("store_node_evicting = %q, want 1", v)
	}
	if !strings.Contains(logs.String(), "maxmemory-policy volatile-lru may evict records") {
		t.Fatalf("no warning in the log:\n%s", logs.String())
	}
}

// TestVolatileRedisWarns: a Redis with neither persistence nor replica
// (the tests' default) is a warning at start, and the gauges show it; a
// noeviction Redis starts without --allow-evicting-redis.
func TestVolatileRedisWarns(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	d, logs := startOn(t, redis)
	if !strings.Contains(logs.String(), "neither persistence nor a replica") || !strings.Contains(logs.String(), `"level":"WARN"`) {
		t.Fatalf("no warning in the log:\n%s", logs.String())
	}
	m := scrape(t, d)
	for name, want := range map[string]string{"evicting": "0", "persistent": "0", "replicas": "0"} {
		if v := metricValue(m, `idem_extproc_store_node_`+name+`{node="`+redis.Addr()+`"}`); v != want {
			t.Errorf("store_node_%s = %q, want %s", name, v, want)
		}
	}
	if v := metricValue(m, "idem_extproc_store_dataset_lost_total"); v != "0" {
		t.Errorf("store_dataset_lost_total = %q before any loss, want 0 (the alert needs it from start)", v)
	}

	persistent := redistest.Start(t, redistest.Options{Persist: true})
	d2, logs2 := startOn(t, persistent)
	if strings.Contains(logs2.String(), "may lose records") {
		t.Fatalf("a warning for a persistent Redis:\n%s", logs2.String())
	}
	if v := metricValue(scrape(t, d2), `idem_extproc_store_node_persistent{node="`+persistent.Addr()+`"}`); v != "1" {
		t.Fatalf("store_node_persistent = %q, want 1", v)
	}
}

// TestVanishedDatasetIsCounted: FLUSHALL (or a restart that came back
// empty) removes the marker; the next periodic check logs an error and
// counts it, once.
func TestVanishedDatasetIsCounted(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	d, logs := startOn(t, redis, "--store-check-interval", "20ms")
	if err := redis.Do(context.Background(), "FLUSHALL").Err(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, func() bool { return metricValue(scrape(t, d), "idem_extproc_store_dataset_lost_total") == "1" })
	if !strings.Contains(logs.String(), "redis dataset vanished") || !strings.Contains(logs.String(), `"level":"ERROR"`) {
		t.Fatalf("no error line:\n%s", logs.String())
	}
	// The marker is written again, so the next loss (a restart without
	// persistence) is counted too.
	if n, err := redis.Client().Exists(context.Background(), "idem:{marker:0}").Result(); err != nil || n != 1 {
		t.Fatalf("marker not rewritten: %d %v", n, err)
	}
	redis.Kill()
	redis.Restart()
	testwait.For(t, func() bool { return metricValue(scrape(t, d), "idem_extproc_store_dataset_lost_total") == "2" })
}

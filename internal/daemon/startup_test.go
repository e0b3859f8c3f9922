package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/testing/ports"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// connectedClients is the number of clients Redis counts (INFO clients).
func connectedClients(t *testing.T, r *redistest.Server) int {
	t.Helper()
	info, err := r.Do(context.Background(), "INFO", "clients").Text()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no connected_clients in %q", info)
	return 0
}

// TestFailedStartClosesEverything drives each way Start can fail after it
// has opened something, and shows that it closed all of it: both ports can
// be bound again, tracing was shut down, and Redis sees no connection of
// the server's left.
func TestFailedStartClosesEverything(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	// A store that opens, then refuses the start: its Redis may evict.
	evicting := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	empty := filepath.Join(t.TempDir(), "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	otlp := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + ports.Hold(t)}
	for _, tc := range []struct {
		name string
		// args get --listen, --admin-listen and --redis-url first; taken
		// is "listen" or "admin" for a port held while Start runs.
		args  []string
		env   map[string]string
		taken string
		want  string
		// redis is the Redis the server is given; the shared one when nil.
		redis *redistest.Server
	}{
		{name: "listen port taken", env: otlp, taken: "listen", want: "--listen"},
		{name: "admin port taken", env: otlp, taken: "admin", want: "--admin-listen"},
		{name: "store", redis: evicting, env: otlp, want: "maxmemory-policy"},
		{name: "tracing", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, want: "tracing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var shutdowns atomic.Int32
			newTracerProvider = func(ctx context.Context, getenv func(string) string) (trace.TracerProvider, func(context.Context) error, error) {
				tp, shutdown, err := observe.NewTracerProvider(ctx, getenv)
				if err != nil {
					return nil, nil, err
				}
				return tp, func(ctx context.Context) error { shutdowns.Add(1); return shutdown(ctx) }, nil
			}
			t.Cleanup(func() { newTracerProvider = observe.NewTracerProvider })
			redis := redis
			if tc.redis != nil {
				redis = tc.redis
			}
			before := connectedClients(t, redis)
			listen, admin := ports.Hold(t), ports.Hold(t)
			if tc.taken != "" {
				held := map[string]string{"listen": listen, "admin": admin}[tc.taken]
				l, err := net.Listen("tcp", held)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
			}
			args := append([]string{"--listen", listen, "--admin-listen", admin, "--redis-url", redis.URL()}, tc.args...)
			cfg, err := ParseConfig(args, env(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			d, err := Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), env(tc.env))
			if err == nil {
				d.Shutdown()
				t.Fatal("Start succeeded")
			}
			if d != nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, %v; want nil and an error naming %s", d, err, tc.want)
			}
			for _, addr := range []string{listen, admin} {
				if addr == map[string]string{"listen": listen, "admin": admin}[tc.taken] {
					continue // the test holds it
				}
				l, err := net.Listen("tcp", addr)
				if err != nil {
					t.Fatalf("after the failed start %s is still taken: %v", addr, err)
				}
				l.Close()
			}
			if tc.name != "tracing" && shutdowns.Load() != 1 {
				t.Fatalf("tracing shut down %d times, want once", shutdowns.Load())
			}
			// Redis notices a closed connection when it reads it: wait
			// for the count to come back, without a time margin to judge.
			testwait.Until(t, "the server's Redis connections closed", func() bool { return connectedClients(t, redis) <= before })
		})
	}
}

// TestFilesCheckedBeforeAnythingOpens: each file a flag names is read and
// checked before tracing, the store or a port is opened, and a file that
// does not load is a configuration error (Main's exit 2) naming its flag.
// Before the one startup sequence, the TLS files were read only once the
// store and both ports were open, and a bad --redis-ca-file failed as
// "--redis-url" with exit 1.
func TestFilesCheckedBeforeAnythingOpens(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	badPolicies := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(badPolicies, []byte("defaults:\n  lease: forever\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"admin token", []string{"--admin-token-file", missing}, "--admin-token-file"},
		{"key ring", []string{"--encryption-keys-file", empty}, "--encryption-keys-file"},
		{"policies", []string{"--config", badPolicies}, "defaults.lease"},
		{"tls files", []string{"--tls-cert-file", empty, "--tls-key-file", empty}, "--tls-cert-file"},
		{"redis ca", []string{"--redis-url", "rediss://127.0.0.1:1/0", "--redis-ca-file", empty}, "--redis-ca-file"},
		{"redis client cert", []string{"--redis-url", "rediss://127.0.0.1:1/0", "--redis-cert-file", empty, "--redis-key-file", empty}, "--redis-cert-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newTracerProvider = func(context.Context, func(string) string) (trace.TracerProvider, func(context.Context) error, error) {
				t.Error("tracing was started before every file was checked")
				return nil, func(context.Context) error { return nil }, nil
			}
			t.Cleanup(func() { newTracerProvider = observe.NewTracerProvider })
			// The port is held: a start that got as far as listening would
			// fail naming --listen instead.
			held, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			args := append([]string{"--listen", held.Addr().String(), "--admin-listen", ""}, tc.args...)
			var stderr strings.Builder
			if code := Main(t.Context(), args, env(nil), &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, want 2 naming %s; stderr:\n%s", code, tc.want, stderr.String())
			}
		})
	}
}

package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/server"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Listen: ":50051", AdminListen: ":8081", StoreTimeout: 100 * time.Millisecond,
		DrainTimeout: 15 * time.Second, MaxMessageSize: 32 << 20, MemoryMaxRecords: 1_000_000, LogLevel: slog.LevelInfo, LogFormat: "json",
		StoreCheckInterval: 30 * time.Second, RegionIdleConns: 8, RegionPingInterval: 5 * time.Second, RegionDefaultRTT: 150 * time.Millisecond,
		Keepalive: server.DefaultKeepalive, EnvoyMaxMessageTimeout: 2500 * time.Millisecond}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("defaults = %+v, want %+v", cfg, want)
	}
}

func TestParseConfigSources(t *testing.T) {
	e := env(map[string]string{
		"IDEM_LISTEN":        "127.0.0.1:9000",
		"IDEM_REDIS_URL":     "redis://from-env:6379/0",
		"IDEM_ADMIN_LISTEN":  "127.0.0.1:9001",
		"IDEM_STORE_TIMEOUT": "80ms",
	})
	cfg, err := ParseConfig([]string{"--redis-url", "redis://from-flag:6379/1", "--log-level", "debug"}, e, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9000" || cfg.AdminListen != "127.0.0.1:9001" || cfg.StoreTimeout != 80*time.Millisecond {
		t.Fatalf("environment not applied: %+v", cfg)
	}
	if cfg.RedisURL != "redis://from-flag:6379/1" {
		t.Fatalf("a flag must win over the environment: %q", cfg.RedisURL)
	}
	if cfg.LogLevel != slog.LevelDebug {
		t.Fatalf("log level %v", cfg.LogLevel)
	}
}

func TestParseConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"bad duration in env", nil, map[string]string{"IDEM_STORE_TIMEOUT": "fast"}, []string{"IDEM_STORE_TIMEOUT", "--store-timeout"}},
		{"zero store timeout", []string{"--store-timeout", "0s"}, nil, []string{"--store-timeout: must be positive"}},
		{"negative batch slots", []string{"--redis-batch-slots", "-1"}, nil, []string{"--redis-batch-slots: -1 is not from 1 to 64, or 0 for automatic"}},
		{"bad log level from env", nil, map[string]string{"IDEM_LOG_LEVEL": "loud"}, []string{"--log-level (from IDEM_LOG_LEVEL)", "loud"}},
		{"bad log format", []string{"--log-format", "xml"}, nil, []string{"--log-format", "xml"}},
		{"bad redis scheme", []string{"--redis-url", "http://x"}, nil, []string{"--redis-url", "redis://"}},
		{"tiny message size", []string{"--max-message-size", "1000"}, nil, []string{"--max-message-size"}},
		{"keepalive under gRPC's floor", []string{"--keepalive-time", "500ms"}, nil, []string{"--keepalive-time: 500ms is under 1s"}},
		{"no keepalive timeout", nil, map[string]string{"IDEM_KEEPALIVE_TIMEOUT": "0s"}, []string{"--keepalive-timeout (from IDEM_KEEPALIVE_TIMEOUT): must be positive"}},
		{"cert without key", []string{"--tls-cert-file", "c.pem"}, nil, []string{"--tls-cert-file", "--tls-key-file"}},
		{"client CA without cert", []string{"--tls-client-ca-file", "ca.pem"}, nil, []string{"--tls-client-ca-file"}},
		{"SANs without client CA", []string{"--tls-cert-file", "c", "--tls-key-file", "k", "--tls-allowed-sans", "spiffe://x"}, nil, []string{"--tls-allowed-sans"}},
		{"Redis CA with a plain URL", []string{"--redis-url", "redis://h:6379", "--redis-ca-file", "ca.pem"}, nil, []string{"--redis-ca-file", "TLS URL"}},
		{"Redis password file without Redis", []string{"--redis-password-file", "pw"}, nil, []string{"--redis-password-file", "need --redis-url"}},
		{"empty listen", []string{"--listen", ""}, nil, []string{"--listen"}},
		{"listen without a port", []string{"--listen", "nonsense"}, nil, []string{"--listen", "not host:port"}},
		{"admin port out of range", nil, map[string]string{"IDEM_ADMIN_LISTEN": "127.0.0.1:99999"}, []string{"--admin-listen (from IDEM_ADMIN_LISTEN)", "port"}},
		{"stray argument", []string{"serve"}, nil, []string{"unexpected arguments"}},
		{"every mistake at once", []string{"--log-format", "xml", "--log-level", "loud"}, nil, []string{"--log-format", "--log-level"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(tc.args, env(tc.env), io.Discard)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestMainBadConfigFileExitsTwo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(path, []byte("defaults:\n  lease: forever\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	code := Main(t.Context(), []string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", ""}, env(nil), &out)
	if code != 2 || !strings.Contains(out.String(), path+":2: defaults.lease") {
		t.Fatalf("exit %d, output %q", code, out.String())
	}
}

func TestMainConfigErrorExitsTwo(t *testing.T) {
	var out strings.Builder
	code := Main(t.Context(), []string{"--log-format", "xml"}, env(nil), &out)
	if code != 2 || !strings.Contains(out.String(), "--log-format") {
		t.Fatalf("exit %d, output %q", code, out.String())
	}
	if code := Main(t.Context(), []string{"--help"}, env(nil), io.Discard); code != 0 {
		t.Fatalf("--help exits %d", code)
	}
}

package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisstore"
)

// Config is the daemon's configuration: flags, each also settable by an
// environment variable IDEM_<FLAG> (upper case, dashes as underscores).
// A flag on the command line wins over the environment.
type Config struct {
	// Listen is the gRPC ext_proc address.
	Listen string
	// AdminListen serves /healthz and /readyz.
	AdminListen string
	// RedisURL selects the Redis store; empty means the in-memory store.
	RedisURL string
	// StoreTimeout bounds each store call made while Envoy waits.
	StoreTimeout time.Duration
	// DrainTimeout bounds how long open streams may run after SIGTERM.
	DrainTimeout time.Duration
	// MaxMessageSize bounds one ext_proc message. A BUFFERED body arrives
	// as one message, so it must exceed Envoy's buffer limit.
	MaxMessageSize int
	LogLevel       slog.Level
	// LogFormat is "json" or "text".
	LogFormat string
}

// EnvPrefix starts the environment variable of every flag.
const EnvPrefix = "IDEM_"

// EnvName returns the environment variable that sets a flag.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ErrHelp is returned when -h or --help was asked for; usage was printed.
var ErrHelp = flag.ErrHelp

// ParseConfig reads the configuration from args and the environment
// (getenv, usually os.Getenv). It reports every mistake at once, each
// naming its flag and, when it came from there, its environment variable.
func ParseConfig(args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	var cfg Config
	var logLevel string
	fs := flag.NewFlagSet("idem-extproc", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.StringVar(&cfg.Listen, "listen", ":50051", "gRPC ext_proc listen address")
	fs.StringVar(&cfg.AdminListen, "admin-listen", ":8081", "HTTP address for /healthz and /readyz")
	fs.StringVar(&cfg.RedisURL, "redis-url", "", "Redis URL: redis://[user:pass@]host:port/db, redis+sentinel://host:port,…/master[/db], redis+cluster://host:port,… (rediss… for TLS); empty: in-memory store (one replica only)")
	fs.DurationVar(&cfg.StoreTimeout, "store-timeout", 100*time.Millisecond, "budget of one store call; keep it under Envoy's message_timeout (200ms by default)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 15*time.Second, "how long open streams may finish after SIGTERM/SIGINT")
	fs.IntVar(&cfg.MaxMessageSize, "max-message-size", 32<<20, "largest ext_proc message accepted, in bytes; above Envoy's buffer limit, since a BUFFERED body is one message")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "json", "log format: json or text")

	if err := fs.Parse(args); err != nil {
		return cfg, err // the flag package already printed it with the usage
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	fromEnv := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) {
		env := EnvName(f.Name)
		v := getenv(env)
		if v == "" || onCommandLine[f.Name] {
			return
		}
		fromEnv[f.Name] = env
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s (flag --%s): %w", env, f.Name, err))
		}
	})
	// where names a value's source in error messages.
	where := func(name string) string {
		if env, ok := fromEnv[name]; ok {
			return "--" + name + " (from " + env + ")"
		}
		return "--" + name
	}
	if err := cfg.LogLevel.UnmarshalText([]byte(logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("%s: %q is not one of debug, info, warn, error", where("log-level"), logLevel))
	}
	if cfg.LogFormat != "json" && cfg.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("%s: %q is not json or text", where("log-format"), cfg.LogFormat))
	}
	if cfg.Listen == "" {
		errs = append(errs, fmt.Errorf("%s: must not be empty", where("listen")))
	}
	if cfg.StoreTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("store-timeout")))
	}
	if cfg.MaxMessageSize < 1<<20 {
		errs = append(errs, fmt.Errorf("%s: %d is below 1 MiB, the smallest Envoy buffer", where("max-message-size"), cfg.MaxMessageSize))
	}
	if cfg.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative", where("drain-timeout")))
	}
	if cfg.RedisURL != "" {
		if _, err := redisstore.ParseURL(cfg.RedisURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where("redis-url"), err))
		}
	}
	return cfg, errors.Join(errs...)
}

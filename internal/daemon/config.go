package daemon

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/server"
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
	// ConfigFile is the policy configuration (YAML); empty means the
	// built-in default policy.
	ConfigFile string
	// AdminTokenFile holds the admin API's bearer token; empty turns the
	// admin API off.
	AdminTokenFile string
	// RedisSecurity holds Redis credentials and TLS material from files.
	RedisSecurity redisstore.Security
	// EncryptionKeysFile is the key ring sealing stored responses for
	// policies with encrypt: true (package seal).
	EncryptionKeysFile string
	// TLS of the ext_proc listener: certificate, key, and for mutual TLS a
	// client CA and the client identities allowed.
	TLSCertFile, TLSKeyFile, TLSClientCAFile string
	TLSAllowedSANs                           []string
	// StoreTimeout bounds each store call made while Envoy waits.
	StoreTimeout time.Duration
	// Region is this server's region; RegionRedis the store of every
	// other region a homes map may name (docs/regions.md).
	Region      string
	RegionRedis regionStores
	// RegionIdleConns are the connections kept open to each other region's
	// store; RegionPingInterval how often each region's store is pinged
	// (keeping them warm, measuring the round trip); RegionDefaultRTT the
	// round trip assumed for a region that does not answer at start.
	RegionIdleConns    int
	RegionPingInterval time.Duration
	RegionDefaultRTT   time.Duration
	// RegionSendHome names the regions a request homed there is sent to
	// through Envoy (extproc.HomeHeader) instead of this server calling
	// their store: those Envoy has a home route for.
	RegionSendHome regionNames
	// EnvoyMaxMessageTimeout is the ext_proc filter's max_message_timeout:
	// the longest Envoy extends a message's timer when asked.
	EnvoyMaxMessageTimeout time.Duration
	// DrainTimeout bounds how long open streams may run after SIGTERM.
	DrainTimeout time.Duration
	// AllowEvictingRedis lets the server start on a Redis whose
	// maxmemory-policy may evict records (see storesafety.go).
	AllowEvictingRedis bool
	// StoreCheckInterval is how often the store's safety is checked again
	// after the check at start.
	StoreCheckInterval time.Duration
	// MemoryMaxRecords bounds the in-memory store.
	MemoryMaxRecords int
	// RedisBatchSlots bounds the batches of script calls in flight at
	// once to one Redis primary (redisstore.Options.BatchSlots).
	RedisBatchSlots int
	// MaxMessageSize bounds one ext_proc message. A BUFFERED body arrives
	// as one message, so it must exceed Envoy's buffer limit.
	MaxMessageSize int
	// Keepalive finds an Envoy gone without closing its connection.
	Keepalive server.Keepalive
	// MaxBufferedBytes bounds the body bytes all streams buffer together;
	// 0 means defaultMaxBufferedBytes (a quarter of the container's
	// memory limit, else 256 MiB).
	MaxBufferedBytes int64
	// GCPercent is the garbage collector's target percent; 0 means
	// DefaultGCPercent unless GOGC is set (gc.go).
	GCPercent int
	LogLevel  slog.Level
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
	var raw rawFlags
	fs := flag.NewFlagSet("idem-extproc", flag.ContinueOnError)
	fs.SetOutput(usage)
	defineFlags(fs, &cfg, &raw)
	if err := fs.Parse(args); err != nil {
		return cfg, err // the flag package already printed it with the usage
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %q", fs.Args()))
	}
	where, envErrs := applyEnv(fs, getenv)
	errs = append(errs, envErrs...)
	errs = append(errs, cfg.check(raw, where)...)
	return cfg, errors.Join(errs...)
}

// rawFlags are the flags parsed into Config only after the command line and
// the environment are read.
type rawFlags struct {
	logLevel, allowedSANs string
}

// Flags returns the server's flags as ParseConfig defines them, for the
// command line's help and shell completion (the values they bind are
// dropped): the flags are defined in one place only.
func Flags() *flag.FlagSet {
	var cfg Config
	var raw rawFlags
	fs := flag.NewFlagSet("idem-extproc", flag.ContinueOnError)
	defineFlags(fs, &cfg, &raw)
	return fs
}

// defineFlags defines every flag on fs, writing into cfg and raw.
func defineFlags(fs *flag.FlagSet, cfg *Config, raw *rawFlags) {
	fs.StringVar(&cfg.Listen, "listen", ":50051", "gRPC ext_proc listen address")
	fs.StringVar(&cfg.AdminListen, "admin-listen", ":8081", "HTTP address serving /healthz (process alive), /readyz (store answers, not draining), /metrics and the admin API; empty: none (gRPC health on --listen remains)")
	fs.StringVar(&cfg.RedisURL, "redis-url", "", "Redis URL: redis://[user:pass@]host:port/db, redis+sentinel://host:port,…/master[/db], redis+cluster://host:port,… (rediss… for TLS); empty: in-memory store (one replica only)")
	fs.StringVar(&cfg.RedisSecurity.PasswordFile, "redis-password-file", "", "file holding the Redis password (of the URL's user, e.g. an ACL user); read on every new connection, so rotation needs no restart")
	fs.StringVar(&cfg.RedisSecurity.CAFile, "redis-ca-file", "", "PEM CA bundle that signs the Redis servers' certificates (rediss URLs); empty: the system roots")
	fs.StringVar(&cfg.RedisSecurity.CertFile, "redis-cert-file", "", "PEM client certificate for Redis servers that require one; reread when it changes")
	fs.StringVar(&cfg.RedisSecurity.KeyFile, "redis-key-file", "", "PEM key of --redis-cert-file")
	fs.StringVar(&cfg.ConfigFile, "config", "", "policy configuration file (YAML, see examples/policies.yaml); reloaded on change and on SIGHUP; empty: the built-in default policy")
	fs.StringVar(&cfg.AdminTokenFile, "admin-token-file", "", "file holding the bearer token of the admin API on --admin-listen; empty: the admin API is off")
	fs.StringVar(&cfg.EncryptionKeysFile, "encryption-keys-file", "", "key ring for policies with encrypt: true: lines of \"<key id> <base64 32 bytes>\", the first seals; reread when it changes")
	fs.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "PEM certificate (chain) of the ext_proc listener; with --tls-key-file turns TLS on; reloaded when the file changes")
	fs.StringVar(&cfg.TLSKeyFile, "tls-key-file", "", "PEM private key of the ext_proc listener")
	fs.StringVar(&cfg.TLSClientCAFile, "tls-client-ca-file", "", "PEM CA bundle: require Envoy's client certificate signed by it (mutual TLS)")
	fs.StringVar(&raw.allowedSANs, "tls-allowed-sans", "", "comma-separated client identities admitted (URI SANs such as spiffe://cluster.local/ns/istio-system/sa/gateway, or DNS names); empty: any client certificate the CA signed")
	fs.DurationVar(&cfg.StoreTimeout, "store-timeout", idem.DefaultStoreTimeout, "budget of each store call (a reservation, with its replica WAIT under durability: replicated; a completion; a renewal); a call past it is a store failure: 503 under fail_closed, pass-through under fail_open. Keep it under the ext_proc filter's message_timeout (200ms by default, 300ms in the shipped configs) with room for the server's own work")
	fs.StringVar(&cfg.Region, "region", "", "this server's region, as the policy file's homes section names regions; with --region-redis, the keys of a scope homed in another region are arbitrated by that region's store (docs/regions.md); empty: every key lives in this server's store")
	fs.Var(&cfg.RegionRedis, "region-redis", "the store of each other region: name=redis-url pairs separated by spaces (the flag may be repeated); the Redis files (--redis-password-file, --redis-ca-file, …) apply to them too; needs --region")
	fs.IntVar(&cfg.RegionIdleConns, "region-idle-conns", 8, "connections kept open to each other region's store (per node), so that a first write rarely pays a new connection's round trips")
	fs.DurationVar(&cfg.RegionPingInterval, "region-ping-interval", 5*time.Second, "how often every region's store is pinged: keeps idle connections warm and updates idem_extproc_region_store_rtt_seconds")
	fs.DurationVar(&cfg.RegionDefaultRTT, "region-default-rtt", 150*time.Millisecond, "round trip assumed for a region whose store does not answer at start, until a restart measures it; each call to another region's store gets --store-timeout plus three round trips")
	fs.Var(&cfg.RegionSendHome, "region-send-home", "the regions Envoy has a home route for, separated by spaces or commas (the flag may be repeated): a request of an enforced policy whose scope is homed in one of them is sent there through Envoy (the x-idem-home header its routes match, and a cleared route cache), where that region's server reserves in its own store; empty: none (envoy/envoy-regions.yaml, docs/regions.md); each must be in --region-redis")
	fs.DurationVar(&cfg.EnvoyMaxMessageTimeout, "envoy-max-message-timeout", DefaultEnvoyMaxMessageTimeout, "the longest Envoy gives one message: the ext_proc filter's max_message_timeout (the shipped configs'), or its message_timeout if longer; the server never asks Envoy for more, since Envoy ignores a longer ask (docs/envoy.md): a wait_for_in_flight is shortened to fit, and a key whose home region's calls cannot fit is refused (idempotency-home-out-of-reach)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", 15*time.Second, "how long open streams may finish after SIGTERM/SIGINT")
	fs.BoolVar(&cfg.AllowEvictingRedis, "allow-evicting-redis", false, "start even when a Redis primary's maxmemory-policy may evict records (anything but noeviction); they can then vanish and their retries run again")
	fs.DurationVar(&cfg.StoreCheckInterval, "store-check-interval", 30*time.Second, "how often each Redis primary's eviction policy, persistence, replicas and marker record are checked again after the check at start")
	fs.IntVar(&cfg.RedisBatchSlots, "redis-batch-slots", 0, "script calls of concurrent streams in flight at once to one Redis primary, each on a connection of its own; calls beyond wait and leave together in one pipeline when a slot frees; 1 to 64. 0 (the default) chooses by the round trip measured at start: 2 slots up to 250µs (a Redis on the same host), no batching beyond (docs/redis.md, Pipelining)")
	fs.IntVar(&cfg.MemoryMaxRecords, "memory-max-records", 1_000_000, "in-memory store only: most records held; past it new keys are refused with 503 (or pass under fail_open), so a flood of keys cannot exhaust memory")
	fs.IntVar(&cfg.MaxMessageSize, "max-message-size", server.DefaultMaxMessageSize, "largest ext_proc message accepted, in bytes, at least 1048576 (1 MiB); above Envoy's buffer limit, since a BUFFERED body is one message")
	fs.DurationVar(&cfg.Keepalive.Time, "keepalive-time", server.DefaultKeepalive.Time, "ping a peer (Envoy) after this long without a frame from it, at least 1s; with --keepalive-timeout it bounds how long the streams of a peer gone without a FIN or a reset stay open, their leases renewed")
	fs.DurationVar(&cfg.Keepalive.Timeout, "keepalive-timeout", server.DefaultKeepalive.Timeout, "how long a pinged peer has to answer before its connection is closed and its streams end")
	fs.DurationVar(&cfg.Keepalive.MinTime, "keepalive-min-time", server.DefaultKeepalive.MinTime, "shortest interval between a peer's keepalive pings accepted; a peer that pings sooner has its connection closed (GOAWAY too_many_pings), so keep it at or under the ext_proc cluster's connection_keepalive.interval")
	fs.Int64Var(&cfg.MaxBufferedBytes, "max-buffered-bytes", 0, "most body bytes all streams buffer at once (request bodies being fingerprinted, responses being stored); past it new protected requests get 503 idempotency-capacity-exceeded; 0: a quarter of the cgroup's memory.max, else 256 MiB")
	fs.IntVar(&cfg.GCPercent, "gc-percent", 0, "Go garbage collector target (GOGC): the heap grows by this percent of the live heap between collections; with a value above 100 the server also sets a soft memory limit (90% of the cgroup's memory.max, else twice --max-buffered-bytes plus 64 MiB) unless GOMEMLIMIT is set; 0: 400, or GOGC when that is set")
	fs.StringVar(&raw.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "json", "log format: json or text")
}

// applyEnv sets each flag not on the command line from its environment
// variable, and returns where, which names a value's source in error
// messages.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) (where func(name string) string, errs []error) {
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
	where = func(name string) string {
		if env, ok := fromEnv[name]; ok {
			return "--" + name + " (from " + env + ")"
		}
		return "--" + name
	}
	return where, errs
}

// check parses the raw flags into c and reports every mistake, each naming
// its flag by where.
func (c *Config) check(raw rawFlags, where func(string) string) []error {
	var errs []error
	if err := c.LogLevel.UnmarshalText([]byte(raw.logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("%s: %q is not one of debug, info, warn, error", where("log-level"), raw.logLevel))
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, fmt.Errorf("%s: %q is not json or text", where("log-format"), c.LogFormat))
	}
	if c.StoreTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("store-timeout")))
	} else if c.StoreTimeout > maxStoreTimeout {
		errs = append(errs, fmt.Errorf("%s: %v is above %v: Envoy's ext_proc message_timeout (200ms by default) would end the request first; "+
			"a far store's calls get their round trips added (--region-redis)", where("store-timeout"), c.StoreTimeout, maxStoreTimeout))
	}
	errs = append(errs, c.checkRegions(where)...)
	for _, san := range strings.Split(raw.allowedSANs, ",") {
		if san = strings.TrimSpace(san); san != "" {
			c.TLSAllowedSANs = append(c.TLSAllowedSANs, san)
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, fmt.Errorf("%s and %s: set both or neither", where("tls-cert-file"), where("tls-key-file")))
	}
	if c.TLSClientCAFile != "" && c.TLSCertFile == "" {
		errs = append(errs, fmt.Errorf("%s: mutual TLS needs --tls-cert-file and --tls-key-file", where("tls-client-ca-file")))
	}
	if len(c.TLSAllowedSANs) > 0 && c.TLSClientCAFile == "" {
		errs = append(errs, fmt.Errorf("%s: needs --tls-client-ca-file to verify client certificates", where("tls-allowed-sans")))
	}
	if err := checkListenAddr(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", where("listen"), err))
	}
	if c.AdminListen != "" { // empty: no admin listener
		if err := checkListenAddr(c.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where("admin-listen"), err))
		}
	}
	if c.RedisBatchSlots < 0 || c.RedisBatchSlots > 64 {
		errs = append(errs, fmt.Errorf("%s: %d is not from 1 to 64, or 0 for automatic", where("redis-batch-slots"), c.RedisBatchSlots))
	}
	if c.MemoryMaxRecords < 1 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("memory-max-records")))
	}
	if c.MaxMessageSize < 1<<20 {
		errs = append(errs, fmt.Errorf("%s: %d is below 1 MiB, the smallest Envoy buffer", where("max-message-size"), c.MaxMessageSize))
	}
	if c.Keepalive.Time < time.Second {
		// grpc-go would raise it to 1 s in silence (server.go, KeepaliveParams).
		errs = append(errs, fmt.Errorf("%s: %v is under 1s, the shortest gRPC allows", where("keepalive-time"), c.Keepalive.Time))
	}
	if c.Keepalive.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("keepalive-timeout")))
	}
	if c.Keepalive.MinTime <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("keepalive-min-time")))
	}
	if c.MaxBufferedBytes < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative (0 picks the default)", where("max-buffered-bytes")))
	}
	if c.GCPercent < 0 {
		errs = append(errs, fmt.Errorf("%s: %d is not a percent above 0 (0 picks the default; GOGC=off turns the collector off)", where("gc-percent"), c.GCPercent))
	}
	if c.StoreCheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("store-check-interval")))
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative", where("drain-timeout")))
	}
	if c.RedisURL != "" {
		if _, err := redisstore.ParseURL(c.RedisURL); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where("redis-url"), err))
		} else if err := c.RedisSecurity.Validate(c.RedisURL); err != nil {
			errs = append(errs, fmt.Errorf("--redis-password-file, --redis-ca-file, --redis-cert-file, --redis-key-file: %w", err))
		}
	} else if c.RedisSecurity != (redisstore.Security{}) {
		errs = append(errs, fmt.Errorf("--redis-password-file, --redis-ca-file, --redis-cert-file, --redis-key-file: need --redis-url"))
	}
	return errs
}

// checkListenAddr refuses an address net.Listen would refuse for its form
// (not for the machine's state, such as a port already taken), so that the
// mistake is a configuration error named at start.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (e.g. :50051 or 127.0.0.1:50051)", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

// maxStoreTimeout is the largest --store-timeout: a budget beyond any
// ext_proc message timeout a deployment sets is a mistake, not a choice.
const maxStoreTimeout = 10 * time.Second

// DefaultEnvoyMaxMessageTimeout is --envoy-max-message-timeout's default:
// the max_message_timeout of the shipped Envoy configurations (checked by
// test/deploytest).
const DefaultEnvoyMaxMessageTimeout = 2500 * time.Millisecond

func (c *Config) checkRegions(where func(string) string) []error {
	var errs []error
	if c.Region == "" {
		if len(c.RegionRedis) > 0 {
			errs = append(errs, fmt.Errorf("%s: needs --region, this server's own region", where("region-redis")))
		}
		if len(c.RegionSendHome) > 0 {
			errs = append(errs, fmt.Errorf("%s: needs --region, this server's own region", where("region-send-home")))
		}
		return errs
	}
	if !config.ValidRegion(c.Region) {
		errs = append(errs, fmt.Errorf("%s: %q is not a region name (1 to 63 lower-case letters, digits, '.', '_' or '-')", where("region"), c.Region))
	}
	for name := range c.RegionRedis {
		switch {
		case name == c.Region:
			errs = append(errs, fmt.Errorf("%s: names this server's own region %q, whose store is --redis-url", where("region-redis"), name))
		case !config.ValidRegion(name):
			errs = append(errs, fmt.Errorf("%s: %q is not a region name", where("region-redis"), name))
		}
	}
	for _, name := range c.RegionSendHome {
		if _, ok := c.RegionRedis[name]; !ok {
			errs = append(errs, fmt.Errorf("%s: %q is not a region of --region-redis", where("region-send-home"), name))
		}
	}
	if c.RegionIdleConns < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative", where("region-idle-conns")))
	}
	if c.RegionPingInterval <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("region-ping-interval")))
	}
	if c.EnvoyMaxMessageTimeout < 0 {
		errs = append(errs, fmt.Errorf("%s: must not be negative", where("envoy-max-message-timeout")))
	}
	if c.RegionDefaultRTT <= 0 {
		errs = append(errs, fmt.Errorf("%s: must be positive", where("region-default-rtt")))
	}
	return errs
}

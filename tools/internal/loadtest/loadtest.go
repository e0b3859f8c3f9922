// Package loadtest is idem-extproc's load tool (tools/idem-loadtest). It
// drives ext_proc servers exactly as Envoy does, through the Envoy-faithful
// driver of package envoysim with an in-process upstream, and measures in
// the same run, with the same driver, idem-extproc and two reference
// servers built into the tool: a no-op server that answers every message
// CONTINUE, and a floor server that answers as idem-extproc does with the
// same Redis calls made bare (refserver.go). Every server runs in a
// process of its own, so the CPU it used per request is read from /proc.
//
// docs/performance.md has the figures, the commands and how to read them.
package loadtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
)

// The scenarios.
const (
	scenarioFirstWrite  = "first-write"
	scenarioReplay      = "replay"
	scenarioUnprotected = "unprotected"
	scenarioMixed       = "mixed"
)

// The servers.
const (
	serverNoop  = "noop"
	serverFloor = "floor"
	// serverMinimal is the floor's handler on grpc-go's default server,
	// a goroutine per stream (see refserver.go).
	serverMinimal = "minimal"
	// serverLean is the floor's replies on the product's store and codec
	// (see refserver.go).
	serverLean = "lean"
	serverIdem = "idem-extproc"
)

// isReference reports whether name is one of the reference servers, which
// the tool runs itself as serve-<name> (refserver.go).
func isReference(name string) bool {
	switch name {
	case serverNoop, serverFloor, serverMinimal, serverLean:
		return true
	}
	return false
}

// selfCommand reports whether arg is a subcommand the tool runs its own
// executable with: a server (serve-<reference>, serve-idem) or the log
// sink.
func selfCommand(arg string) bool {
	name, serve := strings.CutPrefix(arg, "serve-")
	return serve && (isReference(name) || name == "idem") || arg == "log-sink"
}

type config struct {
	scenarios []string
	// servers are the measured servers' names in order: noop, floor and
	// one per idem-extproc build (builds); kinds says what each one is.
	servers []string
	kinds   map[string]string
	builds  []build
	// concurrencies are the concurrent streams each scenario runs at, one
	// after the other; concurrency is the one of the run being reported.
	concurrencies []int
	concurrency   int
	conns, reps   int
	// topologies are the Redis deployments measured, one after the other,
	// each with servers of its own (topologyStandalone, topologyCluster).
	topologies                []string
	slices                    int
	duration, warmup          time.Duration
	initialWarmup             time.Duration
	storeTimeout              time.Duration
	messageTimeout            time.Duration
	keys                      int
	duplicateRate, unprotRate float64
	keyless                   bool
	reqBody, respBody         int
	// respFrom names the corpus class whose answer body the upstream
	// sends, or fillerAnswer for respBody filler bytes.
	respFrom            string
	redisURL, dir       string
	serverArgs          []string
	profileDir          string
	memoryRecords       int
	skipMemory, logPipe bool
	// self is this tool's executable, re-run for the servers.
	self string
	// The flags' raw text.
	unprotectedKind, scenarioList, serverList, serverArgsText string
	concurrencyList, topologyList                             string
	serverBins                                                buildList
	// progress receives what the tool is doing; out the report.
	progress, out io.Writer
}

// Main runs the tool with command-line args and returns the exit code.
//
//	idem-loadtest [flags]              measure (see --help)
//	idem-loadtest memory [flags]       print Redis memory per record
//	idem-loadtest serve-noop|serve-floor|serve-minimal|serve-lean|serve-idem ...   (used by the tool itself)
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if name, ok := strings.CutPrefix(args[0], "serve-"); ok && isReference(name) {
			return serveReference(ctx, name, args[1:], stderr)
		}
		switch args[0] {
		case "serve-idem":
			return serveIdem(ctx, args[1:], stderr)
		case "memory":
			return memoryMain(ctx, args[1:], stdout, stderr)
		case "log-sink":
			return logSink(args[1:], stderr)
		}
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "idem-loadtest: %v\n", err)
		return 2
	}
	cfg.out, cfg.progress = stdout, stderr
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "idem-loadtest: %v\n", err)
		return 1
	}
	return 0
}

// answerClasses are the corpus classes --response-from takes: one answer
// of the class is the upstream's answer to every write.
var answerClasses = []corpus.Class{corpus.Object, corpus.List, corpus.Error, corpus.Order}

// fillerAnswer is the --response-from value for a synthetic answer of
// --response-body bytes, one byte repeated: it compresses far better than
// any API's answer, so no default figure is measured on it.
const fillerAnswer = "filler"

// responseBody is the body the upstream answers writes with.
func (cfg *config) responseBody() []byte {
	if cfg.respFrom == fillerAnswer {
		return jsonBody(cfg.respBody, "id")
	}
	return corpus.New(1).Answer(corpus.Class(cfg.respFrom)).Body
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	cfg := &config{}
	fs := flag.NewFlagSet("idem-loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.scenarioList, "scenario", "first-write,replay,unprotected",
		"comma-separated scenarios: first-write (POST, fresh key), replay (POST of a completed key, same body), "+
			"unprotected (GET; see --unprotected), mixed (see --unprotected-rate and --duplicate-rate)")
	fs.StringVar(&cfg.serverList, "servers", "noop,floor,idem-extproc", "comma-separated servers to measure: noop, floor, minimal (the floor on grpc-go's default server), lean (the floor on the product's store and codec), idem-extproc")
	fs.StringVar(&cfg.concurrencyList, "concurrency", "32", "concurrent streams (requests in flight); a comma-separated list (e.g. 1,4 or 8,32,128,256) measures every scenario at each, and adds the latency and scale sections")
	fs.IntVar(&cfg.conns, "conns", 2, "gRPC connections the streams share (Envoy opens one per worker thread)")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time of each server in each run (a scenario's repetition)")
	fs.IntVar(&cfg.slices, "slices", 5, "slices each server's measured time is cut into; the servers take turns slice by slice, so drift in the machine's speed hits them alike")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "load before each slice's measured time, not counted")
	fs.DurationVar(&cfg.initialWarmup, "initial-warmup", 3*time.Second, "load each server gets once, before any measurement (pools, heap and caches grow to their working size)")
	fs.IntVar(&cfg.reps, "reps", 3, "repetitions of every (scenario, server) run; medians are reported")
	fs.IntVar(&cfg.keys, "keys", 1000, "key space of replays: that many keys are completed before a replay or mixed run")
	fs.Float64Var(&cfg.duplicateRate, "duplicate-rate", 0.3, "mixed: share of protected requests that replay a completed key")
	fs.Float64Var(&cfg.unprotRate, "unprotected-rate", 0.3, "mixed: share of requests that are unprotected")
	fs.StringVar(&cfg.unprotectedKind, "unprotected", "get", "unprotected requests: get (GET, no bodies: two header phases for the no-op) or keyless (POST without a key)")
	fs.IntVar(&cfg.reqBody, "request-body", 256, "request body size of writes, bytes")
	fs.IntVar(&cfg.respBody, "response-body", 1024, "response body size of writes, bytes")
	fs.StringVar(&cfg.respFrom, "response-from", string(corpus.Object), "the upstream's answer to writes: a class of the generated corpus (object, list, error, order: internal/testing/corpus), a realistic JSON answer that compresses as live traffic does; or filler, a JSON object of --response-body bytes of one byte repeated")
	fs.StringVar(&cfg.redisURL, "redis-url", "", "Redis for idem-extproc and the floor server; empty: start redis-server on a free loopback port (see --redis)")
	fs.StringVar(&cfg.topologyList, "redis", topologyStandalone, "Redis the tool starts, a comma-separated list measured one after the other with fresh servers: standalone (one redis-server), cluster (a 3-primary Redis Cluster; Redis CPU is summed over its nodes)")
	fs.Var(&cfg.serverBins, "server-bin", "idem-extproc binary to measure (go build ./cmd/idem-extproc), or several as label=path, comma-separated or repeated (e.g. base=/tmp/a,new=/tmp/b): each is a server of its own, taking turns with the others, and the report gives each one's ratios to the first; empty: this tool runs the same daemon code itself")
	fs.StringVar(&cfg.serverArgsText, "server-args", "", "extra idem-extproc flags, space-separated (e.g. --log-level=warn)")
	fs.StringVar(&cfg.profileDir, "profile-dir", "", "write each server's CPU profile over its whole life (<server>.cpu.pprof) and allocation profile at its exit (<server>.allocs.pprof) here; idem-extproc's only with an empty --server-bin")
	fs.DurationVar(&cfg.storeTimeout, "store-timeout", idem.DefaultStoreTimeout, "budget of each Redis call of idem-extproc and the floor server (idem-extproc's --store-timeout); the default is the product's")
	fs.DurationVar(&cfg.messageTimeout, "message-timeout", 0, "the driver's ext_proc message_timeout; 0: the recommended filter's (envoy/envoy.yaml)")
	fs.IntVar(&cfg.memoryRecords, "memory-records", 10000, "records written to measure Redis's used_memory growth per record")
	fs.BoolVar(&cfg.skipMemory, "skip-memory", false, "do not measure Redis memory per record")
	fs.BoolVar(&cfg.logPipe, "log-pipe", false, "servers write their output into a pipe that a log sink process drains into the file, as a container runtime does (its CPU is reported apart); default: straight into the file")
	fs.StringVar(&cfg.dir, "work-dir", "", "directory for the servers' logs and Redis; empty: a temporary one, removed at the end")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	cfg.scenarios = splitList(cfg.scenarioList)
	for _, s := range cfg.scenarios {
		if !slices.Contains([]string{scenarioFirstWrite, scenarioReplay, scenarioUnprotected, scenarioMixed}, s) {
			errs = append(errs, fmt.Errorf("--scenario: unknown %q", s))
		}
	}
	if cfg.respFrom != fillerAnswer && !slices.Contains(answerClasses, corpus.Class(cfg.respFrom)) {
		errs = append(errs, fmt.Errorf("--response-from: unknown %q (want filler or a corpus class, one of %v)", cfg.respFrom, answerClasses))
	}
	servers := splitList(cfg.serverList)
	for _, s := range servers {
		if !isReference(s) && s != serverIdem {
			errs = append(errs, fmt.Errorf("--servers: unknown %q", s))
		}
	}
	if len(cfg.scenarios) == 0 || len(servers) == 0 {
		errs = append(errs, errors.New("--scenario and --servers must name at least one each"))
	}
	var err error
	if cfg.builds, err = cfg.serverBins.builds(); err != nil {
		errs = append(errs, err)
	}
	cfg.servers, cfg.kinds = expandServers(servers, cfg.builds)
	if cfg.concurrencies, err = parseCounts(cfg.concurrencyList); err != nil {
		errs = append(errs, fmt.Errorf("--concurrency: %w", err))
	} else {
		cfg.concurrency = cfg.concurrencies[0]
	}
	cfg.topologies = splitList(cfg.topologyList)
	for _, t := range cfg.topologies {
		if t != topologyStandalone && t != topologyCluster {
			errs = append(errs, fmt.Errorf("--redis: %q is not standalone or cluster", t))
		}
	}
	switch {
	case len(cfg.topologies) == 0:
		errs = append(errs, errors.New("--redis must name standalone, cluster or both"))
	case cfg.redisURL != "" && !slices.Equal(cfg.topologies, []string{topologyStandalone}):
		errs = append(errs, errors.New("--redis-url names the one Redis to use: --redis cluster needs the tool to start it"))
	}
	if cfg.conns < 1 || cfg.reps < 1 || cfg.slices < 1 {
		errs = append(errs, errors.New("--conns, --reps and --slices must be positive"))
	}
	if cfg.duration <= 0 || cfg.warmup < 0 || cfg.initialWarmup < 0 {
		errs = append(errs, errors.New("--duration must be positive, --warmup and --initial-warmup not negative"))
	}
	if cfg.keys < 1 {
		errs = append(errs, errors.New("--keys must be positive"))
	}
	if cfg.duplicateRate < 0 || cfg.duplicateRate > 1 || cfg.unprotRate < 0 || cfg.unprotRate > 1 {
		errs = append(errs, errors.New("--duplicate-rate and --unprotected-rate must be within [0, 1]"))
	}
	switch cfg.unprotectedKind {
	case "get":
	case "keyless":
		cfg.keyless = true
	default:
		errs = append(errs, fmt.Errorf("--unprotected: %q is not get or keyless", cfg.unprotectedKind))
	}
	cfg.serverArgs = strings.Fields(cfg.serverArgsText)
	self, err := os.Executable()
	if err != nil {
		errs = append(errs, fmt.Errorf("own executable: %w", err))
	}
	cfg.self = self
	return cfg, errors.Join(errs...)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// serveReference runs the reference server named which (noop, floor,
// minimal or lean) until ctx ends.
func serveReference(ctx context.Context, which string, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve-"+which, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "ext_proc address")
	redisURL := fs.String("redis-url", "", "Redis (serve-floor, serve-minimal, serve-lean)")
	storeTimeout := fs.Duration("store-timeout", idem.DefaultStoreTimeout, "budget of each Redis call (serve-floor, serve-minimal, serve-lean)")
	cpuProfile := fs.String("cpuprofile", "", "CPU profile file")
	memProfile := fs.String("memprofile", "", "allocation profile file, written at exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	return withProfiles(*cpuProfile, *memProfile, stderr, func() int {
		var err error
		switch which {
		case serverNoop:
			err = serveGRPC(ctx, *listen, noopServer{}, daemonGRPC)
		case serverLean:
			// The product's collector setting too, as the daemon makes it
			// when nothing overrides it (daemon.DefaultGCPercent).
			debug.SetGCPercent(daemon.DefaultGCPercent)
			var l *leanServer
			if l, err = newLeanServer(*redisURL, *storeTimeout); err == nil {
				err = serveGRPC(ctx, *listen, l, productGRPC)
			}
		default:
			newServer := daemonGRPC
			if which == serverMinimal {
				newServer = defaultGRPC
			}
			var f *floorServer
			if f, err = newFloorServer(ctx, *redisURL, *storeTimeout); err == nil {
				err = serveGRPC(ctx, *listen, f, newServer)
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "serve-%s: %v\n", which, err)
			return 1
		}
		return 0
	})
}

// withProfiles runs serve under the CPU profiler when cpu is set, and
// writes the allocation profile to mem when it returns.
func withProfiles(cpu, mem string, stderr io.Writer, serve func() int) int {
	if cpu != "" {
		f, err := os.Create(cpu)
		if err != nil {
			fmt.Fprintf(stderr, "profile: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "profile: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	code := serve()
	if mem != "" {
		f, err := os.Create(mem)
		if err != nil {
			fmt.Fprintf(stderr, "profile: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			fmt.Fprintf(stderr, "profile: %v\n", err)
		}
	}
	return code
}

// serveIdem runs idem-extproc's daemon exactly as cmd/idem-extproc does,
// optionally under the CPU profiler and writing an allocation profile at
// exit: serve-idem [--cpuprofile=F] [--memprofile=F] -- <daemon flags>.
func serveIdem(ctx context.Context, args []string, stderr io.Writer) int {
	var cpuProfile, memProfile string
	for len(args) > 0 && args[0] != "--" {
		switch {
		case strings.HasPrefix(args[0], "--cpuprofile="):
			cpuProfile = strings.TrimPrefix(args[0], "--cpuprofile=")
		case strings.HasPrefix(args[0], "--memprofile="):
			memProfile = strings.TrimPrefix(args[0], "--memprofile=")
		default:
			fmt.Fprintf(stderr, "serve-idem: unexpected %q before --\n", args[0])
			return 2
		}
		args = args[1:]
	}
	if len(args) > 0 {
		args = args[1:]
	}
	return withProfiles(cpuProfile, memProfile, stderr, func() int {
		return daemon.Main(ctx, args, os.Getenv, stderr)
	})
}

// memoryMain is the memory subcommand.
func memoryMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idem-loadtest memory", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis-url", "", "Redis to measure on; empty: start redis-server on a free loopback port")
	body := fs.Int("response-body", 1024, "response body size, bytes")
	records := fs.Int("records", 10000, "records written to measure used_memory growth per record")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	dir, err := os.MkdirTemp("", "idem-loadtest-")
	if err != nil {
		fmt.Fprintf(stderr, "idem-loadtest memory: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	r, err := connectRedis(*redisURL, dir)
	if err != nil {
		fmt.Fprintf(stderr, "idem-loadtest memory: %v\n", err)
		return 1
	}
	defer r.close()
	m, err := measureMemory(ctx, r, jsonBody(*body, "id"), *records)
	if err != nil {
		fmt.Fprintf(stderr, "idem-loadtest memory: %v\n", err)
		return 1
	}
	m.print(stdout)
	return 0
}

func connectRedis(url, dir string) (*redisServer, error) {
	if url == "" {
		return startRedis(dir)
	}
	r, err := openRedis(url)
	if err != nil {
		return nil, err
	}
	if err := r.rdb.Ping(context.Background()).Err(); err != nil {
		r.close()
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	return r, nil
}

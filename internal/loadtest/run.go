package loadtest

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/envoysim"
)

// runResult is one measured run of one scenario against one server.
type runResult struct {
	rep              int
	scenario, server string
	elapsed          time.Duration
	n                int
	kinds            [numKinds]int
	errs             int
	errMsg           string
	total            dist
	phases           map[envoysim.Phase]dist
	// CPU used over the measured window by the server, Redis (when the
	// tool started it) and the load generator itself.
	cpu, redisCPU, driverCPU time.Duration
	haveRedisCPU             bool
	// mallocs is the server's heap allocations over the window
	// (idem-extproc's go_memstats_mallocs_total).
	mallocs     float64
	haveMallocs bool
	// decisions are idem-extproc's decisions over the window, by name.
	decisions map[string]float64
}

func (r *runResult) rps() float64 { return float64(r.n) / r.elapsed.Seconds() }

// perRequest returns d per request in microseconds.
func (r *runResult) perRequest(d time.Duration) float64 {
	if r.n == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(r.n)
}

// the phases a report shows, in order.
var reportPhases = []envoysim.Phase{envoysim.PhaseRequestHeaders, envoysim.PhaseRequestBody,
	envoysim.PhaseResponseHeaders, envoysim.PhaseResponseBody}

func run(ctx context.Context, cfg *config) error {
	dir := cfg.dir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "idem-loadtest-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var rs *redisServer
	needRedis := cfg.needs(serverFloor) || cfg.needs(serverIdem)
	if needRedis {
		var err error
		if rs, err = connectRedis(cfg.redisURL, dir); err != nil {
			return err
		}
		defer rs.close()
	}
	spec := serverSpec{self: cfg.self, serverBin: cfg.serverBin, extraArgs: cfg.serverArgs, dir: dir,
		profile: cfg.cpuProfile, memProfile: cfg.memProfile}
	if rs != nil {
		spec.redisURL = rs.url
	}
	servers := map[string]*server{}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	for _, name := range cfg.servers {
		cfg.logf("starting %s", name)
		s, err := startServer(ctx, name, spec)
		if s != nil {
			servers[name] = s
		}
		if err != nil {
			return err
		}
	}
	printMachine(ctx, cfg, rs)

	var results []*runResult
	for rep := 1; rep <= cfg.reps; rep++ {
		for _, sc := range cfg.scenarios {
			for _, name := range cfg.servers {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				r, err := measureRun(ctx, cfg, servers[name], rs, sc, rep)
				if err != nil {
					return fmt.Errorf("rep %d, %s, %s: %w", rep, sc, name, err)
				}
				cfg.logf("rep %d %-12s %-13s %8.0f req/s  p99 %6.0f µs  server CPU %5.0f µs/req  errors %d",
					rep, sc, name, r.rps(), us(r.total.p99), r.perRequest(r.cpu), r.errs)
				results = append(results, r)
			}
		}
	}
	// Stop the servers now: the daemon writes its profiles on the way out.
	for name, s := range servers {
		s.stop()
		delete(servers, name)
	}
	if cfg.cpuProfile != "" {
		cfg.logf("idem-extproc CPU profile: %s", cfg.cpuProfile)
	}
	if cfg.memProfile != "" {
		cfg.logf("idem-extproc allocation profile: %s", cfg.memProfile)
	}

	for _, sc := range cfg.scenarios {
		printScenario(cfg, sc, results)
	}
	printTargets(cfg, results)
	if rs != nil && !cfg.skipMemory {
		m, err := measureMemory(ctx, rs, jsonBody(cfg.respBody, "id"), cfg.memoryRecords)
		if err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		fmt.Fprintln(cfg.out)
		m.print(cfg.out)
	}
	if cfg.dir != "" {
		fmt.Fprintf(cfg.out, "\nlogs: %s\n", dir)
	}
	return nil
}

func (cfg *config) needs(server string) bool {
	for _, s := range cfg.servers {
		if s == server {
			return true
		}
	}
	return false
}

func (cfg *config) logf(format string, a ...any) {
	fmt.Fprintf(cfg.progress, "idem-loadtest: "+format+"\n", a...)
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// metricsWanted are the idem-extproc metrics a run reads at both edges.
var metricsWanted = []string{"go_memstats_mallocs_total", "idem_extproc_decisions_total"}

// measureRun runs one scenario against one server.
func measureRun(ctx context.Context, cfg *config, srv *server, rs *redisServer, scenario string, rep int) (*runResult, error) {
	if rs != nil {
		if err := rs.flush(ctx); err != nil {
			return nil, err
		}
	}
	wl := newWorkload(scenario, cfg.reqBody, cfg.respBody)
	wl.keys, wl.duplicateRate, wl.unprotectedRate, wl.keyless = cfg.keys, cfg.duplicateRate, cfg.unprotRate, cfg.keyless
	d, err := newDriver(srv.addr, cfg.conns, cfg.concurrency, srv.name, wl)
	if err != nil {
		return nil, err
	}
	defer d.close()
	if wl.needsKeys() {
		if _, err := d.prepare(ctx, cfg.keys); err != nil {
			return nil, err
		}
	}
	type edge struct {
		cpu, redisCPU, driverCPU time.Duration
		haveRedis                bool
		metrics                  map[string]float64
		err                      error
	}
	var edges [2]edge
	mark := func(start bool) {
		e := &edges[1]
		if start {
			e = &edges[0]
		}
		e.cpu, e.err = processCPU(srv.pid())
		e.redisCPU, e.haveRedis = 0, false
		if rs != nil {
			e.redisCPU, e.haveRedis = rs.cpu()
		}
		e.driverCPU, _ = processCPU(os.Getpid())
		if srv.admin != "" && e.err == nil {
			e.metrics, e.err = scrapeMetrics("http://"+srv.admin+"/metrics", metricsWanted...)
		}
	}
	elapsed := d.measure(ctx, cfg.warmup, cfg.duration, mark)
	for _, e := range edges {
		if e.err != nil {
			return nil, e.err
		}
	}
	r := &runResult{rep: rep, scenario: scenario, server: srv.name, elapsed: elapsed,
		cpu: edges[1].cpu - edges[0].cpu, driverCPU: edges[1].driverCPU - edges[0].driverCPU,
		redisCPU: edges[1].redisCPU - edges[0].redisCPU, haveRedisCPU: edges[0].haveRedis && edges[1].haveRedis,
		phases: map[envoysim.Phase]dist{}}
	var total []time.Duration
	var phases [envoysim.PhaseResponseTrailers + 1][]time.Duration
	for _, rec := range d.recs {
		total = append(total, rec.total...)
		for p := range phases {
			phases[p] = append(phases[p], rec.phases[p]...)
		}
		for k := range rec.kinds {
			r.kinds[k] += rec.kinds[k]
		}
		r.errs += rec.errs
		if r.errMsg == "" {
			r.errMsg = rec.errMsg
		}
	}
	r.n = len(total)
	r.total = summarise(total)
	for _, p := range reportPhases {
		if len(phases[p]) > 0 {
			r.phases[p] = summarise(phases[p])
		}
	}
	if m0, m1 := edges[0].metrics, edges[1].metrics; m0 != nil && m1 != nil {
		if a, ok := m1["go_memstats_mallocs_total"]; ok {
			r.mallocs, r.haveMallocs = a-m0["go_memstats_mallocs_total"], true
		}
		r.decisions = map[string]float64{}
		for k, v := range m1 {
			if name, ok := strings.CutPrefix(k, "idem_extproc_decisions_total"); ok {
				if delta := v - m0[k]; delta > 0 {
					r.decisions[decisionLabel(name)] += delta
				}
			}
		}
	}
	return r, nil
}

// decisionLabel extracts the decision label of a metric's label set.
func decisionLabel(labels string) string {
	_, rest, ok := strings.Cut(labels, `decision="`)
	if !ok {
		return labels
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

func printMachine(ctx context.Context, cfg *config, rs *redisServer) {
	model := "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	redisVersion := "none"
	if rs != nil {
		redisVersion = rs.version(ctx)
	}
	bin := cfg.serverBin
	if bin == "" {
		bin = "this tool's serve-idem (daemon.Main, as cmd/idem-extproc)"
	}
	fmt.Fprintf(cfg.out, "machine: %d CPUs (%s), %s, redis-server %s\n", runtime.NumCPU(), model, runtime.Version(), redisVersion)
	fmt.Fprintf(cfg.out, "load: %d concurrent streams over %d gRPC connections, %v measured after %v of warm-up, %d repetitions\n",
		cfg.concurrency, cfg.conns, cfg.duration, cfg.warmup, cfg.reps)
	fmt.Fprintf(cfg.out, "idem-extproc: %s, --redis-url, default policy, metrics on, JSON logs at info to a file, no tracing %s\n",
		bin, strings.Join(cfg.serverArgs, " "))
}

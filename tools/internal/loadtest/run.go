package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// runResult is one measured run of one scenario against one server.
type runResult struct {
	rep              int
	scenario, server string
	// concurrency is the run's concurrent streams, topology its Redis.
	concurrency int
	topology    string
	// reference marks a run of scenario made during another scenario's
	// run (during), interleaved with it, as that scenario's target asks:
	// the floor's first write, measured among the replays.
	reference bool
	during    string
	elapsed   time.Duration
	n         int
	kinds     [numKinds]int
	errs      int
	errMsg    string
	total     dist
	phases    map[envoysim.Phase]dist
	// CPU used over the measured window by the server, Redis (when the
	// tool started it) and the load generator itself.
	cpu, redisCPU, driverCPU time.Duration
	haveRedisCPU             bool
	// sinkCPU is the CPU of the process writing the server's log.
	sinkCPU time.Duration
	// syscr, syscw are the server's read and write system calls.
	syscr, syscw int64
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

// referenceNote says, for a reference run, during which scenario's run it
// was measured.
func (r *runResult) referenceNote() string {
	if !r.reference {
		return ""
	}
	return "  (reference, during " + r.during + ")"
}

// syscallsPerRequest is the server's read and write system calls per
// request: how well it batches.
func (r *runResult) syscallsPerRequest() float64 {
	if r.n == 0 {
		return 0
	}
	return float64(r.syscr+r.syscw) / float64(r.n)
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
	if cfg.profileDir != "" {
		if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
			return err
		}
	}
	var results []*runResult
	var mems []memorySection
	for i, topo := range cfg.topologies {
		rr, mem, err := runTopology(ctx, cfg, topo, filepath.Join(dir, topo), i == 0)
		if err != nil {
			err = fmt.Errorf("%s Redis: %w", topo, err)
			if i > 0 {
				// Keep what the earlier topologies measured.
				done := *cfg
				done.topologies = cfg.topologies[:i]
				if rerr := report(&done, results, mems, dir); rerr != nil {
					err = errors.Join(err, rerr)
				}
			}
			return err
		}
		results = append(results, rr...)
		mems = append(mems, mem...)
	}
	if cfg.profileDir != "" {
		cfg.logf("profiles in %s", cfg.profileDir)
	}
	return report(cfg, results, mems, dir)
}

// memorySection is the Redis memory figures of one run, measured on its
// standalone Redis after the servers stopped.
type memorySection struct {
	m   memoryFigures
	err error
}

// runTopology starts topo's Redis and every server on it, measures them,
// stops them all, and returns the results and (on a standalone Redis,
// unless cfg skips it) the memory figures.
func runTopology(ctx context.Context, cfg *config, topo, dir string, first bool) ([]*runResult, []memorySection, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	var rs *redisServer
	if slices.ContainsFunc(cfg.servers, func(s string) bool { return cfg.kinds[s] != serverNoop }) { // all but the no-op use Redis
		var err error
		if topo == topologyCluster {
			cfg.logf("starting a 3-primary Redis Cluster")
			rs, err = startCluster(dir, 3)
		} else {
			rs, err = connectRedis(cfg.redisURL, dir)
		}
		if err != nil {
			return nil, nil, err
		}
		defer rs.close()
	}
	spec := serverSpec{self: cfg.self, dir: dir, storeTimeout: cfg.storeTimeout,
		extraArgs:  append([]string{"--store-timeout=" + cfg.storeTimeout.String()}, cfg.serverArgs...),
		profileDir: cfg.profileDir, logPipe: cfg.logPipe}
	if cfg.profileDir != "" && len(cfg.topologies) > 1 {
		spec.profileDir = filepath.Join(cfg.profileDir, topo)
		if err := os.MkdirAll(spec.profileDir, 0o755); err != nil {
			return nil, nil, err
		}
	}
	if rs != nil {
		spec.redisURL = rs.url
	}
	servers := map[string]*server{}
	defer func() {
		for _, s := range servers {
			s.stop()
		}
	}()
	if err := startServers(ctx, cfg, spec, servers); err != nil {
		return nil, nil, err
	}
	if first {
		printMachine(ctx, cfg, rs)
	}
	ordered := make([]*server, 0, len(cfg.servers))
	for _, name := range cfg.servers {
		ordered = append(ordered, servers[name])
	}
	if err := warmServers(ctx, cfg, ordered, rs); err != nil {
		return nil, nil, err
	}
	results, err := measureAll(ctx, cfg, ordered, rs, topo)
	if err != nil {
		return nil, nil, err
	}
	// Stop the servers now: the daemon writes its profiles on the way out.
	for name, s := range servers {
		s.stop()
		delete(servers, name)
	}
	var mems []memorySection
	if rs != nil && !cfg.skipMemory && len(rs.nodes) == 0 {
		m, err := measureMemory(ctx, rs, cfg.responseBody(), cfg.memoryRecords)
		mems = append(mems, memorySection{m: m, err: err})
	}
	return results, mems, nil
}

// startServers starts cfg's servers in order into servers, which holds
// every one started, for the caller to stop, even when one fails.
func startServers(ctx context.Context, cfg *config, spec serverSpec, servers map[string]*server) error {
	for _, name := range cfg.servers {
		cfg.logf("starting %s", name)
		s, err := startServer(ctx, name, cfg.kinds[name], cfg.binOf(name), spec)
		if s != nil {
			servers[name] = s
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// measureAll measures every scenario on the servers at every concurrency
// cfg.reps times, logging each result as it comes, and returns them all.
// Each repetition goes through every concurrency, so that the machine's
// drift spreads over all of them alike.
func measureAll(ctx context.Context, cfg *config, servers []*server, rs *redisServer, topo string) ([]*runResult, error) {
	var results []*runResult
	for rep := 1; rep <= cfg.reps; rep++ {
		for _, conc := range cfg.concurrencies {
			for _, sc := range cfg.scenarios {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				rr, err := measureScenario(ctx, cfg, servers, rs, sc, rep, conc)
				if err != nil {
					return nil, fmt.Errorf("rep %d, %d streams, %s: %w", rep, conc, sc, err)
				}
				for _, r := range rr {
					r.topology = topo
					cfg.logf("%s rep %d %3d streams %-12s %-13s %8.0f req/s  p99 %6.0f µs  server CPU %5.0f µs/req  errors %d%s",
						topo, rep, conc, r.scenario, r.server, r.rps(), us(r.total.p99), r.perRequest(r.cpu), r.errs, r.referenceNote())
				}
				results = append(results, rr...)
			}
		}
	}
	return results, nil
}

// report prints, for each Redis topology and concurrency, the results and
// the targets' verdicts; then the latency and scale sections when the run
// had more than one concurrency or topology; then the memory figures, and
// where the logs are when cfg named their directory dir.
func report(cfg *config, results []*runResult, mems []memorySection, dir string) error {
	for _, topo := range cfg.topologies {
		for _, conc := range cfg.concurrencies {
			cell := cfg.cell(topo, conc)
			rr := cellResults(results, topo, conc)
			if len(cfg.topologies) > 1 || len(cfg.concurrencies) > 1 {
				fmt.Fprintf(cfg.out, "\n#### %s Redis, %d concurrent streams\n", topo, conc)
			}
			for _, sc := range cfg.scenarios {
				printScenario(cell, sc, rr)
			}
			printTargets(cell, rr)
		}
	}
	printLatency(cfg, results)
	printScale(cfg, results)
	for _, m := range mems {
		if m.err != nil {
			return fmt.Errorf("memory: %w", m.err)
		}
		fmt.Fprintln(cfg.out)
		m.m.print(cfg.out)
	}
	if cfg.dir != "" {
		fmt.Fprintf(cfg.out, "\nlogs: %s\n", dir)
	}
	return nil
}

// cell is cfg as the report of one topology and concurrency sees it.
func (cfg *config) cell(topo string, conc int) *config {
	c := *cfg
	c.concurrency = conc
	c.topologies = []string{topo}
	return &c
}

// cellResults are the results of one topology and concurrency.
func cellResults(results []*runResult, topo string, conc int) []*runResult {
	var out []*runResult
	for _, r := range results {
		if r.topology == topo && r.concurrency == conc {
			out = append(out, r)
		}
	}
	return out
}

// needs reports whether cfg measures a server of kind.
func (cfg *config) needs(kind string) bool {
	for _, s := range cfg.servers {
		if cfg.kinds[s] == kind {
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

// measureScenario runs one repetition of a scenario against every server.
// Machines like the one this targets (two shared vCPUs) drift in speed by
// tens of percent over a minute, so the servers are not measured one after
// the other: the measured time is cut into slices, and the servers take
// turns, one slice each per round (each slice after its own warm-up), the
// round's first server rotating. Every server then sees the same machine,
// and a ratio of two servers' figures compares like with like.
func measureScenario(ctx context.Context, cfg *config, servers []*server, rs *redisServer, scenario string, rep, conc int) ([]*runResult, error) {
	parts := participants(servers, scenario)
	if rs != nil {
		if err := rs.flush(ctx); err != nil {
			return nil, err
		}
	}
	var states []*scenarioState
	defer func() {
		for _, st := range states {
			st.d.close()
		}
	}()
	for _, pt := range parts {
		st, err := openParticipant(ctx, cfg, pt, rs, scenario, rep, conc)
		if st != nil {
			states = append(states, st)
		}
		if err != nil {
			return nil, err
		}
	}
	slice := cfg.duration / time.Duration(cfg.slices)
	for round := range cfg.slices {
		for j := range states {
			if err := measureSlice(ctx, cfg, states[(round+j)%len(states)], rs, slice); err != nil {
				return nil, err
			}
		}
	}
	out := make([]*runResult, 0, len(states))
	for _, st := range states {
		st.r.collect(st.d.recs)
		out = append(out, st.r)
	}
	return out, nil
}

// participant is one server measured in a scenario, in that scenario or,
// as the reference of a target, in another.
type participant struct {
	srv       *server
	scenario  string
	reference bool
}

// participants are the servers measured in scenario: each of servers in
// it, and for the replay scenario the floor's first write too.
func participants(servers []*server, scenario string) []participant {
	var parts []participant
	for _, srv := range servers {
		parts = append(parts, participant{srv: srv, scenario: scenario})
	}
	// The replay target compares with the floor's first write: measure it
	// here too, taking turns with the replays, rather than in another run
	// on a machine whose speed has since drifted.
	if scenario == scenarioReplay {
		for _, srv := range servers {
			if srv.kind == serverFloor {
				parts = append(parts, participant{srv: srv, scenario: scenarioFirstWrite, reference: true})
			}
		}
	}
	return parts
}

// scenarioState is one participant's driver and the result its slices add
// up to.
type scenarioState struct {
	srv     *server
	d       *driver
	r       *runResult
	metrics [2]map[string]float64
}

// openParticipant opens pt's driver, its keys prepared when its workload
// needs them. A state it returns with an error has a driver to close.
func openParticipant(ctx context.Context, cfg *config, pt participant, rs *redisServer, scenario string, rep, conc int) (*scenarioState, error) {
	srv := pt.srv
	wl := newWorkload(pt.scenario, cfg.reqBody, cfg.responseBody())
	wl.keys, wl.duplicateRate, wl.unprotectedRate, wl.keyless = cfg.keys, cfg.duplicateRate, cfg.unprotRate, cfg.keyless
	wl.messageTimeout = cfg.messageTimeout
	d, err := newDriver(srv.addr, cfg.conns, conc, srv.kind, wl)
	if err != nil {
		return nil, err
	}
	st := &scenarioState{srv: srv, d: d, r: &runResult{rep: rep, scenario: pt.scenario, server: srv.name,
		concurrency: conc, reference: pt.reference, during: scenario,
		haveRedisCPU: rs.ownsProcesses(), phases: map[envoysim.Phase]dist{}}}
	if wl.needsKeys() {
		if _, err := d.prepare(ctx, cfg.keys); err != nil {
			return st, fmt.Errorf("%s: %w", srv.name, err)
		}
	}
	return st, nil
}

// measureSlice measures st's server for one slice, after cfg's warm-up,
// and adds the slice's time, CPU, syscalls and metrics to st's result.
func measureSlice(ctx context.Context, cfg *config, st *scenarioState, rs *redisServer, slice time.Duration) error {
	var cpu, redisCPU, driverCPU, sinkCPU [2]time.Duration
	var syscr, syscw [2]int64
	var errs [2]error
	// The scrape of idem-extproc's metrics costs it and this process CPU
	// (rendering and parsing some 30 KB of text) and makes syscalls: the
	// first is taken before the window's counters are read and the second
	// after, so that neither is counted as the requests' cost.
	scrape := func(i int) {
		if st.srv.admin != "" && errs[i] == nil {
			st.metrics[i], errs[i] = scrapeMetrics("http://"+st.srv.admin+"/metrics", metricsWanted...)
		}
	}
	mark := func(start bool) {
		i := 1
		if start {
			i = 0
			scrape(i)
		}
		var err error
		cpu[i], err = procCPU(st.srv.pid())
		errs[i] = errors.Join(errs[i], err)
		syscr[i], syscw[i], _ = procSyscalls(st.srv.pid())
		sinkCPU[i] = st.srv.sinkCPU()
		if rs != nil {
			redisCPU[i], _ = rs.cpu()
		}
		driverCPU[i], _ = procCPU(os.Getpid())
		if !start {
			scrape(i)
		}
	}
	elapsed := st.d.measure(ctx, cfg.warmup, slice, mark)
	if err := errors.Join(errs[0], errs[1]); err != nil {
		return fmt.Errorf("%s: %w", st.srv.name, err)
	}
	st.r.elapsed += elapsed
	st.r.cpu += cpu[1] - cpu[0]
	st.r.redisCPU += redisCPU[1] - redisCPU[0]
	st.r.driverCPU += driverCPU[1] - driverCPU[0]
	st.r.sinkCPU += sinkCPU[1] - sinkCPU[0]
	st.r.syscr += syscr[1] - syscr[0]
	st.r.syscw += syscw[1] - syscw[0]
	st.r.addMetrics(st.metrics[0], st.metrics[1])
	return nil
}

// warmServers gives each server a mix of every kind of request once,
// before anything is measured.
func warmServers(ctx context.Context, cfg *config, servers []*server, rs *redisServer) error {
	if cfg.initialWarmup <= 0 {
		return nil
	}
	for _, srv := range servers {
		cfg.logf("warming %s up for %v", srv.name, cfg.initialWarmup)
		wl := newWorkload(scenarioMixed, cfg.reqBody, cfg.responseBody())
		wl.keys, wl.duplicateRate, wl.unprotectedRate = 100, 0.3, 0.3
		d, err := newDriver(srv.addr, cfg.conns, slices.Max(cfg.concurrencies), srv.kind, wl)
		if err != nil {
			return err
		}
		// The warm-up is load, not a measurement: a request that fails
		// here (a stall on a loaded machine) is logged, and a server that
		// answers wrongly shows its errors in the measured runs.
		if _, err := d.prepare(ctx, wl.keys); err != nil {
			cfg.logf("warming %s up (not measured): %v", srv.name, err)
		}
		d.warm(ctx, cfg.initialWarmup)
		d.close()
	}
	if rs != nil {
		return rs.flush(ctx)
	}
	return nil
}

// collect merges the workers' measurements.
func (r *runResult) collect(recs []*recorder) {
	var total []time.Duration
	var phases [envoysim.PhaseResponseTrailers + 1][]time.Duration
	for _, rec := range recs {
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
}

// addMetrics adds what idem-extproc's metrics say happened between two
// readings: heap allocations and decisions.
func (r *runResult) addMetrics(m0, m1 map[string]float64) {
	if m0 == nil || m1 == nil {
		return
	}
	if a, ok := m1["go_memstats_mallocs_total"]; ok {
		r.mallocs += a - m0["go_memstats_mallocs_total"]
		r.haveMallocs = true
	}
	if r.decisions == nil {
		r.decisions = map[string]float64{}
	}
	for k, v := range m1 {
		if name, ok := strings.CutPrefix(k, "idem_extproc_decisions_total"); ok {
			if delta := v - m0[k]; delta > 0 {
				r.decisions[decisionLabel(name)] += delta
			}
		}
	}
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
	var bins []string
	for _, b := range cfg.builds {
		bin := b.bin
		if bin == "" {
			bin = "this tool's serve-idem (daemon.Main, as cmd/idem-extproc)"
		}
		if b.label != serverIdem || len(cfg.builds) > 1 {
			bin = b.label + " = " + bin
		}
		bins = append(bins, bin)
	}
	bin := strings.Join(bins, "; ")
	fmt.Fprintf(cfg.out, "machine: %d CPUs (%s), %s, redis-server %s\n", runtime.NumCPU(), model, runtime.Version(), redisVersion)
	concs := make([]string, len(cfg.concurrencies))
	for i, c := range cfg.concurrencies {
		concs[i] = strconv.Itoa(c)
	}
	fmt.Fprintf(cfg.out, "load: %s concurrent streams over %d gRPC connections; per repetition of a scenario each server is measured %v, "+
		"in %d slices taking turns with the other servers, each after %v of warm-up; %d repetitions; Redis: %s\n",
		strings.Join(concs, ", "), cfg.conns, cfg.duration, cfg.slices, cfg.warmup, cfg.reps, strings.Join(cfg.topologies, ", then "))
	logs := "straight into a file"
	if cfg.logPipe {
		logs = "into a pipe drained by a log sink process"
	}
	msgTimeout := "the recommended filter's"
	if cfg.messageTimeout > 0 {
		msgTimeout = cfg.messageTimeout.String()
	}
	fmt.Fprintf(cfg.out, "idem-extproc: %s, --redis-url, default policy, metrics on, JSON logs at info %s, no tracing %s\n",
		bin, logs, strings.Join(cfg.serverArgs, " "))
	fmt.Fprintf(cfg.out, "budgets: each Redis call of idem-extproc and the floor %v (--store-timeout), the driver's message_timeout %s\n",
		cfg.storeTimeout, msgTimeout)
}

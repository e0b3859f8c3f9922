package loadtest

import (
	"context"
	"errors"
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
	var rs *redisServer
	needRedis := cfg.needs(serverFloor) || cfg.needs(serverIdem)
	if needRedis {
		var err error
		if rs, err = connectRedis(cfg.redisURL, dir); err != nil {
			return err
		}
		defer rs.close()
	}
	spec := serverSpec{self: cfg.self, serverBin: cfg.serverBin, dir: dir, storeTimeout: cfg.storeTimeout,
		extraArgs:  append([]string{"--store-timeout=" + cfg.storeTimeout.String()}, cfg.serverArgs...),
		profileDir: cfg.profileDir, logPipe: cfg.logPipe}
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
		return err
	}
	printMachine(ctx, cfg, rs)

	ordered := make([]*server, 0, len(cfg.servers))
	for _, name := range cfg.servers {
		ordered = append(ordered, servers[name])
	}
	if err := warmServers(ctx, cfg, ordered, rs); err != nil {
		return err
	}
	results, err := measureAll(ctx, cfg, ordered, rs)
	if err != nil {
		return err
	}
	// Stop the servers now: the daemon writes its profiles on the way out.
	for name, s := range servers {
		s.stop()
		delete(servers, name)
	}
	if cfg.profileDir != "" {
		cfg.logf("profiles in %s", cfg.profileDir)
	}
	return report(ctx, cfg, rs, results, dir)
}

// startServers starts cfg's servers in order into servers, which holds
// every one started, for the caller to stop, even when one fails.
func startServers(ctx context.Context, cfg *config, spec serverSpec, servers map[string]*server) error {
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
	return nil
}

// measureAll measures every scenario on the servers cfg.reps times,
// logging each result as it comes, and returns them all.
func measureAll(ctx context.Context, cfg *config, servers []*server, rs *redisServer) ([]*runResult, error) {
	var results []*runResult
	for rep := 1; rep <= cfg.reps; rep++ {
		for _, sc := range cfg.scenarios {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			rr, err := measureScenario(ctx, cfg, servers, rs, sc, rep)
			if err != nil {
				return nil, fmt.Errorf("rep %d, %s: %w", rep, sc, err)
			}
			for _, r := range rr {
				cfg.logf("rep %d %-12s %-13s %8.0f req/s  p99 %6.0f µs  server CPU %5.0f µs/req  errors %d%s",
					rep, r.scenario, r.server, r.rps(), us(r.total.p99), r.perRequest(r.cpu), r.errs, r.referenceNote())
			}
			results = append(results, rr...)
		}
	}
	return results, nil
}

// report prints the results, the targets' verdicts, then (with a Redis and
// unless cfg skips it) the memory figures, and where the logs are when
// cfg named their directory dir.
func report(ctx context.Context, cfg *config, rs *redisServer, results []*runResult, dir string) error {
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

// measureScenario runs one repetition of a scenario against every server.
// Machines like the one this targets (two shared vCPUs) drift in speed by
// tens of percent over a minute, so the servers are not measured one after
// the other: the measured time is cut into slices, and the servers take
// turns, one slice each per round (each slice after its own warm-up), the
// round's first server rotating. Every server then sees the same machine,
// and a ratio of two servers' figures compares like with like.
func measureScenario(ctx context.Context, cfg *config, servers []*server, rs *redisServer, scenario string, rep int) ([]*runResult, error) {
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
		st, err := openParticipant(ctx, cfg, pt, rs, scenario, rep)
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
			if srv.name == serverFloor {
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
func openParticipant(ctx context.Context, cfg *config, pt participant, rs *redisServer, scenario string, rep int) (*scenarioState, error) {
	srv := pt.srv
	wl := newWorkload(pt.scenario, cfg.reqBody, cfg.respBody)
	wl.keys, wl.duplicateRate, wl.unprotectedRate, wl.keyless = cfg.keys, cfg.duplicateRate, cfg.unprotRate, cfg.keyless
	wl.messageTimeout = cfg.messageTimeout
	d, err := newDriver(srv.addr, cfg.conns, cfg.concurrency, srv.name, wl)
	if err != nil {
		return nil, err
	}
	st := &scenarioState{srv: srv, d: d, r: &runResult{rep: rep, scenario: pt.scenario, server: srv.name,
		reference: pt.reference, during: scenario,
		haveRedisCPU: rs != nil && rs.proc != nil, phases: map[envoysim.Phase]dist{}}}
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
	mark := func(start bool) {
		i := 1
		if start {
			i = 0
		}
		cpu[i], errs[i] = processCPU(st.srv.pid())
		syscr[i], syscw[i], _ = processSyscalls(st.srv.pid())
		sinkCPU[i] = st.srv.sinkCPU()
		if rs != nil {
			redisCPU[i], _ = rs.cpu()
		}
		driverCPU[i], _ = processCPU(os.Getpid())
		if st.srv.admin != "" && errs[i] == nil {
			st.metrics[i], errs[i] = scrapeMetrics("http://"+st.srv.admin+"/metrics", metricsWanted...)
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
		wl := newWorkload(scenarioMixed, cfg.reqBody, cfg.respBody)
		wl.keys, wl.duplicateRate, wl.unprotectedRate = 100, 0.3, 0.3
		d, err := newDriver(srv.addr, cfg.conns, cfg.concurrency, srv.name, wl)
		if err != nil {
			return err
		}
		_, err = d.prepare(ctx, wl.keys)
		if err == nil {
			d.warm(ctx, cfg.initialWarmup)
		}
		d.close()
		if err != nil {
			return fmt.Errorf("warming %s up: %w", srv.name, err)
		}
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
	bin := cfg.serverBin
	if bin == "" {
		bin = "this tool's serve-idem (daemon.Main, as cmd/idem-extproc)"
	}
	fmt.Fprintf(cfg.out, "machine: %d CPUs (%s), %s, redis-server %s\n", runtime.NumCPU(), model, runtime.Version(), redisVersion)
	fmt.Fprintf(cfg.out, "load: %d concurrent streams over %d gRPC connections; per repetition of a scenario each server is measured %v, "+
		"in %d slices taking turns with the other servers, each after %v of warm-up; %d repetitions\n",
		cfg.concurrency, cfg.conns, cfg.duration, cfg.slices, cfg.warmup, cfg.reps)
	logs := "straight into a file"
	if cfg.logPipe {
		logs = "into a pipe drained by a log sink process"
	}
	fmt.Fprintf(cfg.out, "idem-extproc: %s, --redis-url, default policy, metrics on, JSON logs at info %s, no tracing %s\n",
		bin, logs, strings.Join(cfg.serverArgs, " "))
}

package loadtest

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// answerText says what the upstream answers writes with.
func (cfg *config) answerText() string {
	if cfg.respFrom == fillerAnswer {
		return fmt.Sprintf("a %d-byte body", cfg.respBody)
	}
	return fmt.Sprintf("a %d-byte JSON %s of the generated corpus", len(cfg.responseBody()), cfg.respFrom)
}

func describe(cfg *config, sc string) string {
	unprot := "GET, no bodies either way. idem-extproc and floor: 1 message, CONTINUE with the skip-everything mode_override; noop: 2 messages (both header phases)"
	if cfg.keyless {
		unprot = fmt.Sprintf("POST without a key, %d-byte body. idem-extproc and floor: 1 message, CONTINUE with the skip-everything mode_override; noop: 4 messages", cfg.reqBody)
	}
	switch sc {
	case scenarioFirstWrite:
		return fmt.Sprintf("POST with a fresh Idempotency-Key, %d-byte body; the upstream answers 201 with %s. "+
			"idem-extproc and floor: 4 messages, 2 Redis calls (reserve at the request body, complete at the response body); noop: 4 messages",
			cfg.reqBody, cfg.answerText())
	case scenarioReplay:
		return fmt.Sprintf("POST repeating one of %d completed keys with the same body. idem-extproc and floor: 2 messages, "+
			"answered at the request body from the record (1 Redis call); noop: 4 messages (the upstream answers)", cfg.keys)
	case scenarioUnprotected:
		return unprot
	}
	return fmt.Sprintf("%.0f%% unprotected (%s), of the protected %.0f%% replays of %d completed keys, the rest first writes",
		100*cfg.unprotRate, cfg.unprotectedKind, 100*cfg.duplicateRate, cfg.keys)
}

// pick returns the runs of one scenario against one server, reference
// runs left out.
func pick(results []*runResult, sc, srv string) []*runResult {
	var out []*runResult
	for _, r := range results {
		if r.scenario == sc && r.server == srv && !r.reference {
			out = append(out, r)
		}
	}
	return out
}

// pickReference returns the reference runs of scenario sc against srv
// made during scenario during's runs.
func pickReference(results []*runResult, during, sc, srv string) []*runResult {
	var out []*runResult
	for _, r := range results {
		if r.reference && r.during == during && r.scenario == sc && r.server == srv {
			out = append(out, r)
		}
	}
	return out
}

// summary is the medians of one server's runs of one scenario.
type summary struct {
	runs                     int
	rps, cpu, redisCPU, drv  float64
	syscalls, sink           float64
	allocs                   float64
	haveAllocs, haveRedisCPU bool
	total                    dist
	phases                   map[int]dist
	errs                     int
	rpsByRep, p99ByRep       []float64
	p50ByRep, cpuByRep       []float64
	decisions                map[string]float64
	hasDecisions             bool
}

func summarize(rs []*runResult) summary {
	s := summary{runs: len(rs), phases: map[int]dist{}, decisions: map[string]float64{}}
	if len(rs) == 0 {
		return s
	}
	var cpu, rcpu, drv, allocs, sys, sink []float64
	var p50, p99, p999 []time.Duration
	for _, r := range rs {
		s.rpsByRep = append(s.rpsByRep, r.rps())
		s.p99ByRep = append(s.p99ByRep, float64(r.total.p99))
		s.p50ByRep = append(s.p50ByRep, float64(r.total.p50))
		s.cpuByRep = append(s.cpuByRep, r.perRequest(r.cpu))
		cpu = append(cpu, r.perRequest(r.cpu))
		sys = append(sys, r.syscallsPerRequest())
		sink = append(sink, r.perRequest(r.sinkCPU))
		drv = append(drv, r.perRequest(r.driverCPU))
		if r.haveRedisCPU {
			rcpu = append(rcpu, r.perRequest(r.redisCPU))
		}
		if r.haveMallocs && r.n > 0 {
			allocs = append(allocs, r.mallocs/float64(r.n))
		}
		p50, p99, p999 = append(p50, r.total.p50), append(p99, r.total.p99), append(p999, r.total.p999)
		s.errs += r.errs
		for k, v := range r.decisions {
			s.decisions[k] += v / r.elapsed.Seconds() / float64(len(rs))
			s.hasDecisions = true
		}
	}
	s.rps, s.cpu, s.drv, s.syscalls, s.sink = median(s.rpsByRep), median(cpu), median(drv), median(sys), median(sink)
	s.redisCPU, s.haveRedisCPU = median(rcpu), len(rcpu) == len(rs)
	s.allocs, s.haveAllocs = median(allocs), len(allocs) == len(rs)
	s.total = dist{p50: medianDuration(p50), p99: medianDuration(p99), p999: medianDuration(p999)}
	for _, p := range reportPhases {
		var a, b, c []time.Duration
		for _, r := range rs {
			if d, ok := r.phases[p]; ok {
				a, b, c = append(a, d.p50), append(b, d.p99), append(c, d.p999)
			}
		}
		if len(a) > 0 {
			s.phases[int(p)] = dist{n: len(a), p50: medianDuration(a), p99: medianDuration(b), p999: medianDuration(c)}
		}
	}
	return s
}

func opt(v float64, ok bool, format string) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

func row(w io.Writer, label, server string, rps float64, d dist, cpu, syscalls, sink float64, haveSink bool, redisCPU float64, haveRedis bool, drv, allocs float64, haveAllocs bool, errs int) {
	fmt.Fprintf(w, "%s\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%s\t%s\t%.1f\t%s\t%d\t\n", label, server, rps,
		us(d.p50), us(d.p99), us(d.p999), cpu, syscalls, opt(sink, haveSink, "%.1f"), opt(redisCPU, haveRedis, "%.1f"), drv, opt(allocs, haveAllocs, "%.0f"), errs)
}

func printScenario(cfg *config, sc string, results []*runResult) {
	out := cfg.out
	fmt.Fprintf(out, "\n== %s: %s\n", sc, describe(cfg, sc))
	sums := printRuns(cfg, sc, results)
	for _, srv := range cfg.servers {
		for _, r := range pick(results, sc, srv) {
			if r.errs > 0 {
				fmt.Fprintf(out, "  ERRORS %s rep %d: %d requests failed the check; first: %s\n", srv, r.rep, r.errs, r.errMsg)
			}
		}
	}

	printPhases(cfg, sums)
	idems := cfg.idemServers()
	for _, name := range idems {
		if s := sums[name]; s.hasDecisions {
			printDecisions(out, name, s)
		}
	}
	for i, name := range idems {
		idem := sums[name]
		if idem.runs == 0 {
			continue
		}
		refs := []string{serverFloor, serverMinimal, serverLean, serverNoop}
		if i > 0 {
			// Every later build against the first, the base.
			refs = append([]string{idems[0]}, refs...)
		}
		for _, ref := range refs {
			if r, ok := sums[ref]; ok && r.runs > 0 && r.rps > 0 {
				fmt.Fprintf(out, "  %s / %s: throughput %.2f %s, p99 %.2f %s, server CPU per request %.2f %s (ratios of medians of %d reps [each rep's])\n",
					name, ref, idem.rps/r.rps, perRep(idem.rpsByRep, r.rpsByRep),
					float64(idem.total.p99)/float64(r.total.p99), perRep(idem.p99ByRep, r.p99ByRep),
					idem.cpu/r.cpu, perRep(idem.cpuByRep, r.cpuByRep), idem.runs)
			}
		}
	}
}

// perRep is each repetition's ratio a[i]/b[i], in brackets.
func perRep(a, b []float64) string {
	var parts []string
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			parts = append(parts, fmt.Sprintf("%.2f", a[i]/b[i]))
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// perRepDiff is each repetition's difference a[i]-b[i] of durations in
// nanoseconds, in µs, in brackets, and the median of those differences.
func perRepDiff(a, b []float64) (float64, string) {
	var parts []string
	var d []float64
	for i := range min(len(a), len(b)) {
		d = append(d, (a[i]-b[i])/1e3)
		parts = append(parts, fmt.Sprintf("%.0f", d[len(d)-1]))
	}
	return median(d), "[" + strings.Join(parts, " ") + "]"
}

// printRuns prints scenario sc's table: a row per rep and server, the
// floor's first writes measured with it as the replay's reference, then
// the medians, which it returns by server.
func printRuns(cfg *config, sc string, results []*runResult) map[string]summary {
	tw := tabwriter.NewWriter(cfg.out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rep\tserver\treq/s\tp50 µs\tp99 µs\tp99.9 µs\tCPU µs/req\tsyscalls/req\tlog sink µs/req\tredis µs/req\tdriver µs/req\tallocs/req\terrors\t")
	for rep := 1; rep <= cfg.reps; rep++ {
		for _, srv := range cfg.servers {
			for _, r := range pick(results, sc, srv) {
				if r.rep != rep {
					continue
				}
				allocs := 0.0
				if r.n > 0 {
					allocs = r.mallocs / float64(r.n)
				}
				row(tw, fmt.Sprint(rep), srv, r.rps(), r.total, r.perRequest(r.cpu), r.syscallsPerRequest(), r.perRequest(r.sinkCPU), cfg.logPipe, r.perRequest(r.redisCPU), r.haveRedisCPU,
					r.perRequest(r.driverCPU), allocs, r.haveMallocs, r.errs)
			}
		}
	}
	refs := pickReference(results, sc, scenarioFirstWrite, serverFloor)
	for _, r := range refs {
		row(tw, fmt.Sprint(r.rep), "floor first-write*", r.rps(), r.total, r.perRequest(r.cpu), r.syscallsPerRequest(), r.perRequest(r.sinkCPU), cfg.logPipe,
			r.perRequest(r.redisCPU), r.haveRedisCPU, r.perRequest(r.driverCPU), 0, false, r.errs)
	}
	sums := map[string]summary{}
	for _, srv := range cfg.servers {
		s := summarize(pick(results, sc, srv))
		sums[srv] = s
		row(tw, "median", srv, s.rps, s.total, s.cpu, s.syscalls, s.sink, cfg.logPipe, s.redisCPU, s.haveRedisCPU, s.drv, s.allocs, s.haveAllocs, s.errs)
	}
	if len(refs) > 0 {
		s := summarize(refs)
		row(tw, "median", "floor first-write*", s.rps, s.total, s.cpu, s.syscalls, s.sink, cfg.logPipe, s.redisCPU, s.haveRedisCPU, s.drv, 0, false, s.errs)
	}
	tw.Flush()
	if len(refs) > 0 {
		fmt.Fprintln(cfg.out, "  * the floor's protected first write, measured taking turns with this scenario's servers: the replay target's reference")
	}
	return sums
}

// printPhases prints each server's median latency of each message phase.
func printPhases(cfg *config, sums map[string]summary) {
	fmt.Fprintln(cfg.out, "  latency of each message to its reply, µs p50 / p99 / p99.9 (medians of the reps):")
	tw := tabwriter.NewWriter(cfg.out, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "  server\t")
	for _, p := range reportPhases {
		fmt.Fprintf(tw, "%s\t", p)
	}
	fmt.Fprintln(tw)
	for _, srv := range cfg.servers {
		fmt.Fprintf(tw, "  %s\t", srv)
		for _, p := range reportPhases {
			if d, ok := sums[srv].phases[int(p)]; ok {
				fmt.Fprintf(tw, "%.0f / %.0f / %.0f\t", us(d.p50), us(d.p99), us(d.p999))
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// printDecisions prints idem-extproc's decisions per second, by name, as
// its own metrics counted them in its median run s.
func printDecisions(out io.Writer, name string, s summary) {
	keys := make([]string, 0, len(s.decisions))
	for k := range s.decisions {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.0f/s", k, s.decisions[k]))
	}
	fmt.Fprintf(out, "  %s decisions (its own metrics, mean of the runs): %s\n", name, strings.Join(parts, ", "))
}

// The throughput targets: idem-extproc's throughput over the
// reference's, at 32 streams (printTargets, printAgainstMinimal).
const (
	wantWriteRatio       = 1.15
	wantReplayRatio      = 1.15
	wantUnprotectedRatio = 1.1
)

// printTargets evaluates the throughput targets from this run's medians, for
// each idem-extproc build, at the run's concurrency (the targets are set
// at 32 streams, the latency target at 1: see printLatency).
func printTargets(cfg *config, results []*runResult) {
	floorFW := summarize(pick(results, scenarioFirstWrite, serverFloor))
	noopFW := summarize(pick(results, scenarioFirstWrite, serverNoop))
	floorRP := summarize(pick(results, scenarioReplay, serverFloor))
	floorUP := summarize(pick(results, scenarioUnprotected, serverFloor))
	out := cfg.out
	header := false
	for _, name := range cfg.idemServers() {
		idemFW := summarize(pick(results, scenarioFirstWrite, name))
		idemRP := summarize(pick(results, scenarioReplay, name))
		idemUP := summarize(pick(results, scenarioUnprotected, name))
		if idemFW.runs+idemRP.runs+idemUP.runs == 0 {
			continue
		}
		if !header {
			fmt.Fprintf(out, "\n== targets (set at 32 streams), %d concurrent streams; ratios of medians of %d repetitions, then each repetition's ratio\n",
				cfg.concurrency, cfg.reps)
			header = true
		}
		if len(cfg.idemServers()) > 1 {
			fmt.Fprintf(out, "%s:\n", name)
		}
		if idemFW.runs > 0 && floorFW.runs > 0 {
			tp := idemFW.rps / floorFW.rps
			p99 := float64(idemFW.total.p99) / float64(floorFW.total.p99)
			fmt.Fprintf(out, "protected first write: throughput %.2f x floor %s (>= %g: %s); p99 %.2f x floor %s (<= 1.0: %s); %.0f vs %.0f req/s, p99 %.0f vs %.0f µs\n",
				tp, perRep(idemFW.rpsByRep, floorFW.rpsByRep), wantWriteRatio, verdict(tp >= wantWriteRatio),
				p99, perRep(idemFW.p99ByRep, floorFW.p99ByRep), verdict(p99 <= 1.0),
				idemFW.rps, floorFW.rps, us(idemFW.total.p99), us(floorFW.total.p99))
		}
		if idemFW.runs > 0 && noopFW.runs > 0 && noopFW.cpu > 0 {
			c := idemFW.cpu / noopFW.cpu
			fmt.Fprintf(out, "protected first write: server CPU %.2f x the no-op's %s (<= 1.3: %s); %.1f vs %.1f µs/req\n",
				c, perRep(idemFW.cpuByRep, noopFW.cpuByRep), verdict(c <= 1.3), idemFW.cpu, noopFW.cpu)
		}
		if idemFW.haveAllocs {
			fmt.Fprintf(out, "protected first write: %.0f heap allocations per request (<= 210: %s)\n", idemFW.allocs, verdict(idemFW.allocs <= 210))
		}
		if idemRP.runs > 0 && floorRP.runs > 0 {
			tp := idemRP.rps / floorRP.rps
			fmt.Fprintf(out, "replay: throughput %.2f x the floor's replay %s (>= %g: %s); %.0f vs %.0f req/s\n",
				tp, perRep(idemRP.rpsByRep, floorRP.rpsByRep), wantReplayRatio, verdict(tp >= wantReplayRatio), idemRP.rps, floorRP.rps)
		}
		if idemUP.runs > 0 && floorUP.runs > 0 {
			tp := idemUP.rps / floorUP.rps
			fmt.Fprintf(out, "unprotected: throughput %.2f x the floor %s (>= %g: %s); %.0f vs %.0f req/s\n",
				tp, perRep(idemUP.rpsByRep, floorUP.rpsByRep), wantUnprotectedRatio, verdict(tp >= wantUnprotectedRatio), idemUP.rps, floorUP.rps)
		}
		printAgainstMinimal(out, results, idemFW, idemRP, idemUP)
		var allocs []string
		for _, sc := range cfg.scenarios {
			if s := summarize(pick(results, sc, name)); s.haveAllocs {
				allocs = append(allocs, fmt.Sprintf("%s %.0f", sc, s.allocs))
			}
		}
		if len(allocs) > 0 {
			slices.Sort(allocs)
			fmt.Fprintf(out, "heap allocations per request (go_memstats_mallocs_total, gRPC included): %s\n", strings.Join(allocs, ", "))
		}
	}
}

// printAgainstMinimal prints the throughput targets' ratios against the
// minimal server when the run measured it. docs/performance.md sets them
// against the floor; the minimal server is the kind of reference a comparison
// written from scratch uses (refserver.go), so the same thresholds are
// shown against it, for information.
func printAgainstMinimal(out io.Writer, results []*runResult, fw, rp, up summary) {
	for _, t := range []struct {
		what, sc string
		idem     summary
		want     float64
	}{
		{"protected first write", scenarioFirstWrite, fw, wantWriteRatio},
		{"replay", scenarioReplay, rp, wantReplayRatio},
		{"unprotected", scenarioUnprotected, up, wantUnprotectedRatio},
	} {
		ref := summarize(pick(results, t.sc, serverMinimal))
		if t.idem.runs == 0 || ref.runs == 0 || ref.rps == 0 {
			continue
		}
		tp := t.idem.rps / ref.rps
		fmt.Fprintf(out, "%s: throughput %.2f x minimal %s (the floor's threshold, %.2f: %s); %.0f vs %.0f req/s\n",
			t.what, tp, perRep(t.idem.rpsByRep, ref.rpsByRep), t.want, verdict(tp >= t.want), t.idem.rps, ref.rps)
	}
}

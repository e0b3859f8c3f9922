package loadtest

import (
	"fmt"
	"slices"
	"text/tabwriter"
)

// latencyTarget is the latency target at one stream: at most this much
// added p50 over the floor, and a p99 at most p99Ratio times the floor's.
const (
	latencyTargetStreams  = 1
	latencyTargetAddedP50 = 100.0 // µs
	latencyTargetP99Ratio = 1.05
)

// printLatency prints what a protected first write adds to the latency of
// a whole request (from the stream's first message to its last reply, as
// a client behind Envoy waits for it) over the no-op server, the cost of
// the protocol alone, and over the floor, at each concurrency of the run:
// the medians of each repetition's own difference (the servers took turns
// within it), then every repetition's; and the verdict of the target at
// one stream.
func printLatency(cfg *config, results []*runResult) {
	idems := cfg.idemServers()
	if len(idems) == 0 || !slices.Contains(cfg.scenarios, scenarioFirstWrite) || !(cfg.needs(serverFloor) || cfg.needs(serverNoop)) {
		return
	}
	out := cfg.out
	fmt.Fprintf(out, "\n== latency a user feels: a protected first write, whole request, added over the no-op and the floor; medians of %d repetitions' own differences\n", cfg.reps)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "redis\tstreams\tserver\tp50 µs\tp99 µs\t+p50 over noop\t+p99 over noop\t+p50 over floor\t+p99 over floor\tp99 / floor\t")
	type line struct {
		topo, name string
		conc       int
		d50, d99   string
		r99        string
		a50, q99   float64
		ok         bool
	}
	var lines []line
	for _, topo := range cfg.topologies {
		for _, conc := range cfg.concurrencies {
			rr := cellResults(results, topo, conc)
			noop := summarize(pick(rr, scenarioFirstWrite, serverNoop))
			floor := summarize(pick(rr, scenarioFirstWrite, serverFloor))
			for _, name := range idems {
				idem := summarize(pick(rr, scenarioFirstWrite, name))
				if idem.runs == 0 {
					continue
				}
				cells := []string{"-", "-", "-", "-", "-"}
				if noop.runs > 0 {
					a, _ := perRepDiff(idem.p50ByRep, noop.p50ByRep)
					b, _ := perRepDiff(idem.p99ByRep, noop.p99ByRep)
					cells[0], cells[1] = fmt.Sprintf("%.0f", a), fmt.Sprintf("%.0f", b)
				}
				l := line{topo: topo, name: name, conc: conc}
				if floor.runs > 0 {
					var a, b float64
					a, l.d50 = perRepDiff(idem.p50ByRep, floor.p50ByRep)
					b, l.d99 = perRepDiff(idem.p99ByRep, floor.p99ByRep)
					l.a50, l.q99 = a, float64(idem.total.p99)/float64(floor.total.p99)
					l.r99, l.ok = perRep(idem.p99ByRep, floor.p99ByRep), true
					cells[2], cells[3], cells[4] = fmt.Sprintf("%.0f", a), fmt.Sprintf("%.0f", b), fmt.Sprintf("%.2f", l.q99)
				}
				lines = append(lines, l)
				fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t\n", topo, conc, name, us(idem.total.p50), us(idem.total.p99),
					cells[0], cells[1], cells[2], cells[3], cells[4])
			}
		}
	}
	tw.Flush()
	for _, l := range lines {
		if !l.ok {
			continue
		}
		fmt.Fprintf(out, "  %s, %s Redis, %d streams, each rep: +p50 over floor %s µs, +p99 over floor %s µs, p99 / floor %s\n",
			l.name, l.topo, l.conc, l.d50, l.d99, l.r99)
		if l.conc == latencyTargetStreams {
			fmt.Fprintf(out, "  target at 1 stream, %s: added p50 over the floor %.0f µs (<= %.0f: %s); p99 %.2f x the floor's (<= %.2f: %s)\n",
				l.name, l.a50, latencyTargetAddedP50, verdict(l.a50 <= latencyTargetAddedP50), l.q99, latencyTargetP99Ratio, verdict(l.q99 <= latencyTargetP99Ratio))
		}
	}
}

// printScale prints, when the run had several concurrencies or Redis
// topologies, how each server's CPU and Redis's CPU per request grow with
// the concurrent streams, and on a cluster against one standalone Redis:
// the figures an operator sizes replicas and shards from. Every process
// shares one machine, so only the shape counts, not the absolute rates.
func printScale(cfg *config, results []*runResult) {
	if len(cfg.concurrencies) < 2 && len(cfg.topologies) < 2 {
		return
	}
	out := cfg.out
	fmt.Fprintf(out, "\n== scale: CPU per request by concurrent streams and Redis (medians of %d repetitions; one machine for every process, so read the shape, not the rates)\n", cfg.reps)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tserver\tredis\tstreams\treq/s\tp99 µs\tserver CPU µs/req\tx noop's\tredis CPU µs/req\tredis x standalone\terrors\t")
	for _, sc := range cfg.scenarios {
		for _, name := range cfg.servers {
			for _, topo := range cfg.topologies {
				for _, conc := range cfg.concurrencies {
					rr := cellResults(results, topo, conc)
					s := summarize(pick(rr, sc, name))
					if s.runs == 0 {
						continue
					}
					xNoop := "-"
					if n := summarize(pick(rr, sc, serverNoop)); n.runs > 0 && n.cpu > 0 && name != serverNoop {
						xNoop = fmt.Sprintf("%.2f", s.cpu/n.cpu)
					}
					xStandalone := "-"
					// The no-op makes no Redis call: its Redis CPU is Redis's idle work.
					if topo != topologyStandalone && slices.Contains(cfg.topologies, topologyStandalone) && cfg.kinds[name] != serverNoop {
						base := summarize(pick(cellResults(results, topologyStandalone, conc), sc, name))
						if base.haveRedisCPU && s.haveRedisCPU && base.redisCPU > 0 {
							xStandalone = fmt.Sprintf("%.2f", s.redisCPU/base.redisCPU)
						}
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f\t%.0f\t%.1f\t%s\t%s\t%s\t%d\t\n", sc, name, topo, conc, s.rps, us(s.total.p99),
						s.cpu, xNoop, opt(s.redisCPU, s.haveRedisCPU, "%.1f"), xStandalone, s.errs)
				}
			}
		}
	}
	tw.Flush()
}

package daemon

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
)

// DefaultGCPercent is the garbage collector's target when neither
// --gc-percent nor GOGC sets one. The server's live heap is small (tens of
// MB: connections, pools, the streams in flight) and its work is latency
// bound, so the runtime's 100 runs the collector often for little memory:
// 400 measured 7–14 % less server CPU for a peak heap of 55 MB instead of
// 37 MB at 32 streams.
const DefaultGCPercent = 400

// gcSoftLimitBase is the memory a server needs beside its buffered bodies
// (the runtime, gRPC and Redis buffers, the streams' state), in the soft
// limit gcSettings derives when the container sets none.
const gcSoftLimitBase = 64 << 20

// gcSettings is what the daemon sets on the Go runtime's collector: a
// percent (0: left as the runtime has it) and a soft memory limit (0: left
// as the runtime has it), and why.
type gcSettings struct {
	percent     int
	memoryLimit int64
	// percentFrom and limitFrom name where each value came from, for the
	// startup log line.
	percentFrom, limitFrom string
}

// planGC decides the collector's settings. An explicit --gc-percent wins;
// otherwise a GOGC in the environment is left as the runtime read it at
// start, and without either the percent is DefaultGCPercent. A percent
// above the runtime's 100 (or GOGC=off) lets the heap grow to
// (1 + percent/100) × the live heap, and the live heap holds every buffered
// body (up to budget, --max-buffered-bytes): so a raised percent is paired
// with a soft memory limit, which makes the collector run as the heap
// nears it whatever the percent (runtime/debug SetMemoryLimit). The limit
// is 90 % of the cgroup's memory limit when there is one (as the Helm chart
// sets GOMEMLIMIT, goMemLimitPercent), else twice the body budget plus
// gcSoftLimitBase, so that memory pressure triggers the collector about as
// the runtime's default percent would. A GOMEMLIMIT in the environment is
// left as the runtime read it.
func planGC(cfg Config, budget int64, getenv func(string) string, readFile func(string) ([]byte, error)) gcSettings {
	var s gcSettings
	effective := DefaultGCPercent
	switch {
	case cfg.GCPercent > 0:
		s.percent, s.percentFrom = cfg.GCPercent, "--gc-percent"
		effective = cfg.GCPercent
	case getenv("GOGC") != "":
		s.percentFrom = "GOGC"
		effective = runtimeGOGC(getenv("GOGC"))
	default:
		s.percent, s.percentFrom = DefaultGCPercent, "default"
	}
	switch {
	case getenv("GOMEMLIMIT") != "":
		s.limitFrom = "GOMEMLIMIT"
	case effective >= 0 && effective <= 100:
		s.limitFrom = "runtime" // the collector runs as often as by default
	default:
		if limit, ok := cgroupMemoryLimit(readFile); ok {
			s.memoryLimit, s.limitFrom = limit/10*9, "cgroup memory limit"
		} else {
			s.memoryLimit, s.limitFrom = 2*budget+gcSoftLimitBase, "body budget"
		}
	}
	return s
}

// runtimeGOGC reads GOGC as the runtime does (runtime/mgcpacer.go
// readGOGC): "off" is -1, a number is itself, anything else 100.
func runtimeGOGC(v string) int {
	if v == "off" {
		return -1
	}
	if n, err := strconv.Atoi(v); err == nil {
		return n
	}
	return 100
}

// apply sets s on the runtime and returns the percent and limit in force.
func (s gcSettings) apply() (percent int, limit int64) {
	if s.percent > 0 {
		debug.SetGCPercent(s.percent)
	}
	if s.memoryLimit > 0 {
		debug.SetMemoryLimit(s.memoryLimit)
	}
	percent = debug.SetGCPercent(-1) // read back: SetGCPercent returns the old value
	debug.SetGCPercent(percent)
	return percent, debug.SetMemoryLimit(-1) // a negative limit only reads it
}

// bodyPacer gives the bodies the server buffers less of the collector's
// headroom than the rest of the heap. The collector lets the heap grow to
// (1 + percent/100) × the live heap before it runs again, and a buffered
// body is live heap: at the default 400, a body held while its stream's
// messages make garbage (one message per byte, at worst) would cost five
// times its size. After each collection the pacer sets the percent whose
// goal gives everything but the bodies the percent the daemon chose and
// the bodies bodyHeadroomPercent (pacedPercent).
//
// It learns of each collection from a cleanup attached to an object
// nothing references: the runtime runs it once a collection has found
// the object unreachable (runtime.AddCleanup; runtime/mcleanup.go). The
// object is 64 bytes, not a tiny allocation, which the function's
// documentation says may be batched with others and never be collected.
// The percent is set with debug.SetGCPercent, which takes the heap lock
// and recomputes the goal (runtime/mgcpacer.go setGCPercent,
// gcControllerCommit) without stopping the world.
type bodyPacer struct {
	percent int                       // the percent for everything but the bodies
	mu      sync.Mutex                // the fields below
	held    func() (all, small int64) // the body bytes the server holds now; nil: none yet
	set     int                       // the percent in force
	stopped bool
	live    [1]metrics.Sample
}

// bodyHeadroomPercent is the garbage the collector lets build up per
// buffered body byte before it runs, in percent (at most the daemon's own
// percent).
const bodyHeadroomPercent = 50

// gcCycle is the object whose cleanup marks the end of a collection.
type gcCycle [64]byte

// startBodyPacer paces the collector from now on, for the bodies track
// names. It collects once first: the pacer works from the live heap, which
// the runtime measures only at a collection, and until its first one the
// goal is its minimum heap, 4 MiB × percent/100 (runtime/mgcpacer.go:
// heapMarked is 0 until mark termination, setGCPercent sets heapMinimum,
// commit takes the larger), 16 MiB at the default 400. A server started
// without it let the first body that came in small messages fill that
// much with garbage before any pacing, whatever the body's size.
func startBodyPacer(percent int) *bodyPacer {
	p := &bodyPacer{percent: percent, set: percent}
	p.live[0].Name = "/gc/heap/live:bytes"
	runtime.GC()
	p.arm()
	return p
}

// track gives the pacer the body bytes the server holds. The daemon calls
// it, and hands the server pace for its small bodies, before the server
// serves: a body whose first messages came before would not be paced
// until the next collection, at up to 16 MiB of heap.
func (p *bodyPacer) track(held func() (all, small int64)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = held
}

func (p *bodyPacer) arm() { runtime.AddCleanup(new(gcCycle), (*bodyPacer).collected, p) }

// collected runs after each collection.
func (p *bodyPacer) collected() {
	if p.pace() {
		p.arm()
	}
}

// pace sets the percent for the bodies held now and the live heap the
// last collection found; false once stopped. Called between collections
// too (a body that came to count as small): the runtime recomputes the
// goal of the cycle in progress, and a heap already past it starts a
// collection at its next allocation that checks the trigger
// (runtime/mgcpacer.go setGCPercent; runtime/malloc.go, gcTriggerHeap).
func (p *bodyPacer) pace() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return false
	}
	metrics.Read(p.live[:])
	if p.held != nil && p.live[0].Value.Kind() == metrics.KindUint64 {
		held, small := p.held()
		if pc := pacedPercent(p.percent, int64(p.live[0].Value.Uint64()), held, small); pc != p.set {
			debug.SetGCPercent(pc)
			p.set = pc
		}
	}
	return true
}

// stop ends the pacing and puts back the daemon's percent.
func (p *bodyPacer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped && p.set != p.percent {
		debug.SetGCPercent(p.percent)
	}
	p.stopped = true
}

// pacedPercent is the percent whose goal, (1 + result/100) × live, gives
// the live heap but held bytes of it percent's headroom and the held
// bytes bodyHeadroomPercent's (or percent's, when that is less). held is
// capped at live: bytes counted as held may have become garbage.
//
// While bodies that came in small messages are held (small > 0; extproc's
// budget tells them apart), the whole heap gets at most smallHeadroom:
// their messages make garbage all through the body, which would otherwise
// fill the percent's headroom on the rest of the heap, a constant tens of
// MiB at 400 that a body of a few hundred KiB would cost in full, and
// headroom in proportion to the bodies would add as much again as they
// hold. The price is collections more often while such a body is held,
// for every stream.
func pacedPercent(percent int, live, held, small int64) int {
	if percent <= 0 || live <= 0 || held <= 0 {
		return percent
	}
	held = min(held, live)
	body := int64(min(percent, bodyHeadroomPercent))
	goal := (live-held)*int64(100+percent) + held*(100+body) // × 100
	if small > 0 {
		goal = min(goal, (live+smallHeadroom)*100)
	}
	paced := int(goal/live) - 100
	if small > 0 {
		// The runtime's goal is never below its minimum heap, 4 MiB ×
		// percent/100 (runtime/mgcpacer.go: setGCPercent sets heapMinimum
		// from defaultHeapMinimum, commit takes the larger of the two), so
		// with a live heap of a few MiB the percent that gives live +
		// smallHeadroom would raise that minimum past it: the percent is
		// also at most the one whose minimum heap is the goal.
		paced = min(paced, int(goal/runtimeHeapMinimum))
	}
	return max(1, paced)
}

// runtimeHeapMinimum is the runtime's minimum heap goal at a percent of
// 100 (runtime/mgcpacer.go, defaultHeapMinimum, without the
// heapminimum512kib experiment).
const runtimeHeapMinimum = 4 << 20

// smallHeadroom is the headroom the collector gets while a body that came
// in small messages is held: less would run it every few hundred messages.
const smallHeadroom = 1 << 20

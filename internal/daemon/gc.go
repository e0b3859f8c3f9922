package daemon

import (
	"runtime/debug"
	"strconv"
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

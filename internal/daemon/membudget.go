package daemon

import (
	"strconv"
	"strings"
)

// fallbackMaxBufferedBytes is the body budget when the container's memory
// limit cannot be read.
const fallbackMaxBufferedBytes = 256 << 20

// cgroupMemoryFiles hold the memory limit of the process's cgroup: the
// unified hierarchy (v2) first, then v1's memory controller. In a
// container with its own cgroup namespace (the default of Docker, and of
// Kubernetes on cgroup v2) they are the container's own limit.
var cgroupMemoryFiles = []string{
	"/sys/fs/cgroup/memory.max",
	"/sys/fs/cgroup/memory/memory.limit_in_bytes",
}

// defaultMaxBufferedBytes is a quarter of the container's memory limit,
// leaving the rest to the Go runtime, the gRPC buffers and each message
// as it arrives; fallbackMaxBufferedBytes when no limit is set or none can
// be read. readFile is os.ReadFile in production.
func defaultMaxBufferedBytes(readFile func(string) ([]byte, error)) int64 {
	if n, ok := cgroupMemoryLimit(readFile); ok {
		return n / 4
	}
	return fallbackMaxBufferedBytes
}

// cgroupMemoryLimit reads the container's memory limit; false when none is
// set ("max" in v2, a near-2^63 sentinel in v1) or none can be read.
func cgroupMemoryLimit(readFile func(string) ([]byte, error)) (int64, bool) {
	for _, path := range cgroupMemoryFiles {
		b, err := readFile(path)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n >= 1<<62 {
			return 0, false // "max", or v1's "no limit"
		}
		return n, true
	}
	return 0, false
}

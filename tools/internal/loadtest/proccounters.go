package loadtest

import (
	"fmt"
	"time"

	"github.com/prometheus/procfs"
)

// procCPU is the CPU time (user plus system, every thread) process pid
// has used so far: utime and stime of /proc/<pid>/stat, which procfs
// converts from clock ticks at USER_HZ = 100 (ProcStat.CPUTime), so it
// moves in steps of 10 ms.
func procCPU(pid int) (time.Duration, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), nil
}

// procSyscalls is how many read and write system calls process pid has
// made so far: syscr and syscw of /proc/<pid>/io (procfs.ProcIO).
func procSyscalls(pid int) (reads, writes int64, err error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, 0, fmt.Errorf("process %d: %w", pid, err)
	}
	io, err := p.IO()
	if err != nil {
		return 0, 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return int64(io.SyscR), int64(io.SyscW), nil
}

// Package procstat reads a Linux process's resource counters from /proc:
// the CPU time and the read and write system calls it has used so far.
// The load tool and the store's benchmarks measure servers and
// redis-server with it.
package procstat

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux the tool targets; `getconf CLK_TCK` tells).
const clockTick = 10 * time.Millisecond

// CPU returns the CPU time (user plus system, every thread) a
// process has used so far, from /proc/<pid>/stat.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// Syscalls returns how many read and write system calls a process
// has made so far (syscr and syscw of /proc/<pid>/io).
func Syscalls(pid int) (reads, writes int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes, nil
}

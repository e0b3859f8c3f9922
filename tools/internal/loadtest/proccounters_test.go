package loadtest

import (
	"os"
	"testing"
	"time"
)

// clockTick is the step of procCPU (USER_HZ = 100).
const clockTick = 10 * time.Millisecond

// TestCountersOfThisProcess: the counters read this very process, and grow
// as it works: CPU while it spins (by at least a clock tick before a
// generous deadline that only a stuck counter reaches), the write calls by
// the writes it makes.
func TestCountersOfThisProcess(t *testing.T) {
	pid := os.Getpid()
	cpu0, err := procCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	_, w0, err := procSyscalls(pid)
	if err != nil {
		t.Fatal(err)
	}
	var cpu1 time.Duration
	for end := time.Now().Add(time.Minute); cpu1-cpu0 < clockTick && time.Now().Before(end); {
		if cpu1, err = procCPU(pid); err != nil {
			t.Fatal(err)
		}
	}
	if cpu1-cpu0 < clockTick {
		t.Errorf("CPU grew by %v in a minute of spinning", cpu1-cpu0)
	}
	f, err := os.CreateTemp(t.TempDir(), "w")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 10 {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	_, w1, err := procSyscalls(pid)
	if err != nil {
		t.Fatal(err)
	}
	if w1-w0 < 10 {
		t.Errorf("write calls grew by %d over 10 writes", w1-w0)
	}
}

func TestNoSuchProcess(t *testing.T) {
	if _, err := procCPU(-1); err == nil {
		t.Error("CPU of pid -1: no error")
	}
	if _, _, err := procSyscalls(-1); err == nil {
		t.Error("syscalls of pid -1: no error")
	}
}

package loadtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux the tool targets; `getconf CLK_TCK` tells).
const clockTick = 10 * time.Millisecond

// processCPU returns the CPU time (user plus system, every thread) a
// process has used so far, from /proc/<pid>/stat.
func processCPU(pid int) (time.Duration, error) {
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

// server is one ext_proc server under test, in a process of its own.
type server struct {
	name string
	// addr is the ext_proc address; admin the HTTP admin address
	// (idem-extproc only), serving /metrics.
	addr, admin string
	cmd         *exec.Cmd
	log         string
	exited      chan error
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// stop ends the process with SIGTERM (the daemon then drains and, with a
// profile, writes it) and waits up to 20 s before killing it.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freeAddr() (string, error) {
	p, err := freePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// startProcess runs argv with its output in logPath; it dies with the tool.
func startProcess(name string, argv []string, logPath string) (*server, error) {
	out, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s := &server{name: name, cmd: cmd, log: logPath, exited: make(chan error, 1)}
	go func() {
		s.exited <- cmd.Wait()
		out.Close()
	}()
	return s, nil
}

// waitUntil polls ready until it succeeds, the process exits or 20 s pass.
func (s *server) waitUntil(ready func() error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case exitErr := <-s.exited:
			s.exited <- exitErr
			return fmt.Errorf("%s exited during start (%v); its log: %s", s.name, exitErr, tail(s.log))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 20s: %v; its log: %s", s.name, err, tail(s.log))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tcpReady(addr string) func() error {
	return func() error {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

func httpReady(url string) func() error {
	return func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// serverSpec says how to start each server.
type serverSpec struct {
	self      string // this tool's executable, re-run for the reference servers
	serverBin string // idem-extproc's binary; empty: this tool's serve-idem
	extraArgs []string
	redisURL  string
	dir       string
	// profileDir receives each server's CPU and allocation profiles
	// (idem-extproc's with serve-idem only).
	profileDir string
}

// profileArgs are the flags that make a server write its profiles.
func (spec serverSpec) profileArgs(name string) []string {
	if spec.profileDir == "" {
		return nil
	}
	return []string{"--cpuprofile=" + filepath.Join(spec.profileDir, name+".cpu.pprof"),
		"--memprofile=" + filepath.Join(spec.profileDir, name+".allocs.pprof")}
}

func startServer(ctx context.Context, name string, spec serverSpec) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(spec.dir, name+".log")
	switch name {
	case serverNoop:
		s, err := startProcess(name, append([]string{spec.self, "serve-noop", "--listen", addr}, spec.profileArgs(name)...), logPath)
		if err != nil {
			return nil, err
		}
		s.addr = addr
		return s, s.waitUntil(tcpReady(addr))
	case serverFloor:
		s, err := startProcess(name, append([]string{spec.self, "serve-floor", "--listen", addr, "--redis-url", spec.redisURL}, spec.profileArgs(name)...), logPath)
		if err != nil {
			return nil, err
		}
		s.addr = addr
		return s, s.waitUntil(tcpReady(addr))
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	// The operator's default configuration: Redis, the default policy,
	// metrics on (always), logs at info level as JSON lines, no tracing.
	args := append([]string{"--listen", addr, "--admin-listen", admin, "--redis-url", spec.redisURL}, spec.extraArgs...)
	argv := append([]string{spec.serverBin}, args...)
	if spec.serverBin == "" {
		argv = append(append(append([]string{spec.self, "serve-idem"}, spec.profileArgs(name)...), "--"), args...)
	}
	s, err := startProcess(name, argv, logPath)
	if err != nil {
		return nil, err
	}
	s.addr, s.admin = addr, admin
	return s, s.waitUntil(httpReady("http://" + admin + "/readyz"))
}

// scrapeMetrics reads the Prometheus text exposition at url into a map from
// "name{labels}" to value; only the names wanted are kept.
func scrapeMetrics(url string, wanted ...string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		keep := false
		for _, w := range wanted {
			if strings.HasPrefix(line, w) {
				keep = true
				break
			}
		}
		if !keep {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

package loadtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// server is one ext_proc server under test, in a process of its own.
type server struct {
	// name is the server's name in the report; kind is serverNoop,
	// serverFloor or serverIdem (every idem-extproc build).
	name, kind string
	// addr is the ext_proc address; admin the HTTP admin address
	// (idem-extproc only), serving /metrics.
	addr, admin string
	cmd         *exec.Cmd
	log         string
	exited      chan error
	// sink is the process writing the server's output to log (see
	// startWithSink); nil for a server whose output goes to the file.
	sink     *exec.Cmd
	sinkDone chan struct{}
}

// sinkCPU returns the log sink's CPU time so far (zero without one).
func (s *server) sinkCPU() time.Duration {
	if s.sink == nil {
		return 0
	}
	d, _ := procCPU(s.sink.Process.Pid)
	return d
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
	if s.sink != nil {
		select {
		case <-s.sinkDone: // the server's output is all in the file
		case <-time.After(5 * time.Second):
			_ = s.sink.Process.Kill()
		}
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
	return loopback(p), nil
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// startOnFreePorts runs start, which starts a process on the n ports given
// and waits until it serves, on ports freePort picks. A picked port is free
// only until another process takes it (the tests of several packages run
// side by side, and every outgoing connection takes a port from the same
// range), so a process that exits during start saying its address is in
// use is started again on new ports, up to three times.
func startOnFreePorts(n int, start func(ports []int) (*server, error)) (*server, error) {
	for try := 1; ; try++ {
		ports := make([]int, n)
		for i := range ports {
			p, err := freePort()
			if err != nil {
				return nil, err
			}
			ports[i] = p
		}
		s, err := start(ports)
		if err == nil || s == nil || try == 3 {
			return s, err
		}
		s.stop() // its whole log is in the file once it has stopped
		// Go's net says "address already in use", redis-server
		// "Address already in use" (both strerror(EADDRINUSE)).
		if !strings.Contains(strings.ToLower(tail(s.log)), "address already in use") {
			return s, err
		}
	}
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

// startWithSink runs argv with its output going through a pipe to a log
// sink, this tool's log-sink subcommand writing it to logPath, as a
// container runtime collects a container's output: the server pays for
// writing to a pipe, the sink for reading it and writing the file, and the
// sink's CPU is reported apart (--log-pipe).
func startWithSink(name string, argv []string, logPath, self string) (*server, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	defer pw.Close()
	sink := exec.Command(self, "log-sink", logPath)
	sink.Stdin = pr
	sink.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sink.Start(); err != nil {
		return nil, fmt.Errorf("start the log sink of %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = sink.Process.Kill()
		_ = sink.Wait()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s := &server{name: name, cmd: cmd, log: logPath, exited: make(chan error, 1), sink: sink, sinkDone: make(chan struct{})}
	go func() { s.exited <- cmd.Wait() }()
	go func() {
		_ = sink.Wait()
		close(s.sinkDone)
	}()
	return s, nil
}

// logSink copies its input to a file until the input ends, in large
// writes: what it reads is buffered and written when 256 KiB have gathered
// or a quarter of a second has passed, as log collectors batch.
func logSink(args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "log-sink: want one file")
		return 2
	}
	f, err := os.Create(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "log-sink: %v\n", err)
		return 1
	}
	defer f.Close()
	var mu sync.Mutex
	bw := bufio.NewWriterSize(f, 256<<10)
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				mu.Lock()
				_ = bw.Flush()
				mu.Unlock()
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			mu.Lock()
			_, _ = bw.Write(buf[:n])
			mu.Unlock()
		}
		if err != nil {
			break
		}
	}
	close(done)
	mu.Lock()
	defer mu.Unlock()
	if err := bw.Flush(); err != nil {
		fmt.Fprintf(stderr, "log-sink: %v\n", err)
		return 1
	}
	return 0
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
	extraArgs []string
	redisURL  string
	// storeTimeout is the floor server's per-call Redis budget
	// (idem-extproc's comes in extraArgs).
	storeTimeout time.Duration
	dir          string
	// profileDir receives each server's CPU and allocation profiles
	// (idem-extproc's with serve-idem only).
	profileDir string
	// logPipe sends each server's output through a pipe to a log sink
	// process instead of straight to its file.
	logPipe bool
}

// start runs one server's process with its output going to logPath.
func (spec serverSpec) start(name string, argv []string, logPath string) (*server, error) {
	if spec.logPipe {
		return startWithSink(name, argv, logPath, spec.self)
	}
	return startProcess(name, argv, logPath)
}

// profileArgs are the flags that make a server write its profiles.
func (spec serverSpec) profileArgs(name string) []string {
	if spec.profileDir == "" {
		return nil
	}
	return []string{"--cpuprofile=" + filepath.Join(spec.profileDir, name+".cpu.pprof"),
		"--memprofile=" + filepath.Join(spec.profileDir, name+".allocs.pprof")}
}

// startServer starts the server name of kind; bin is an idem-extproc
// build's binary, empty for this tool's own serve-idem.
func startServer(ctx context.Context, name, kind, bin string, spec serverSpec) (*server, error) {
	s, err := startServerProcess(name, kind, bin, spec)
	if s != nil {
		s.kind = kind
	}
	return s, err
}

func startServerProcess(name, kind, bin string, spec serverSpec) (*server, error) {
	logPath := filepath.Join(spec.dir, name+".log")
	return startOnFreePorts(2, func(ports []int) (*server, error) {
		addr, admin := loopback(ports[0]), loopback(ports[1])
		switch kind {
		case serverNoop:
			s, err := spec.start(name, append([]string{spec.self, "serve-noop", "--listen", addr}, spec.profileArgs(name)...), logPath)
			if err != nil {
				return nil, err
			}
			s.addr = addr
			return s, s.waitUntil(tcpReady(addr))
		case serverFloor, serverMinimal, serverLean:
			s, err := spec.start(name, append([]string{spec.self, "serve-" + kind, "--listen", addr, "--redis-url", spec.redisURL,
				"--store-timeout", spec.storeTimeout.String()}, spec.profileArgs(name)...), logPath)
			if err != nil {
				return nil, err
			}
			s.addr = addr
			return s, s.waitUntil(tcpReady(addr))
		}
		// The operator's default configuration: Redis, the default policy,
		// metrics on (always), logs at info level as JSON lines, no tracing.
		args := append([]string{"--listen", addr, "--admin-listen", admin, "--redis-url", spec.redisURL}, spec.extraArgs...)
		argv := append([]string{bin}, args...)
		if bin == "" {
			argv = append(append(append([]string{spec.self, "serve-idem"}, spec.profileArgs(name)...), "--"), args...)
		}
		s, err := spec.start(name, argv, logPath)
		if err != nil {
			return nil, err
		}
		s.addr, s.admin = addr, admin
		return s, s.waitUntil(httpReady("http://" + admin + "/readyz"))
	})
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

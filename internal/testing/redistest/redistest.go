// Package redistest starts real redis-server processes for tests, each on a
// free loopback port with its own directory, and can kill, hang and restart
// them to inject faults. StartCluster and StartSentinel build a Redis
// Cluster and a Sentinel group from such processes and fail them over;
// LinkProxy freezes a replica's replication stream; DelayLink slows or
// holds back a client's link and heals it; Hostile answers chosen commands
// with replies no Redis sends.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisspec"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/ports"
	"github.com/redis/go-redis/v9"
)

// InstallHint says how to get redis-server when it is missing.
const InstallHint = "redis-server is required by the tests and was not found in PATH; " +
	"install it with `sudo apt-get install redis-server` (Debian/Ubuntu), " +
	"`brew install redis` (macOS) or set REDIS_SERVER to its path"

// Binary returns the path of redis-server: $REDIS_SERVER or the PATH's.
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New(InstallHint)
	}
	return p, nil
}

// Options configures a Server.
type Options struct {
	// Persist turns on the append-only file with fsync on every write, so a
	// killed and restarted server keeps its data.
	Persist bool
	// Args are extra redis-server arguments, e.g. "--maxmemory", "1mb".
	Args []string
	// Password sets requirepass and masterauth; the helpers' own clients
	// authenticate with it.
	Password string
	// Config is written to redis.conf in the server's directory and named
	// first on the command line: Sentinel needs a file it can rewrite.
	Config string
	// TLS, when set, also opens a TLS port (TLSURL); the plain port stays
	// for the helpers' own probes and administration.
	TLS *TLS
	// Sentinel starts the process in Sentinel mode.
	Sentinel bool
	// Cluster enables cluster mode, with nodes.conf in the server's
	// directory and a second free port for the cluster bus.
	Cluster bool
}

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	// busPort is the cluster bus port (Options.Cluster).
	busPort int
	// tlsPort is the TLS port, when Options.TLS is set.
	tlsPort int
	opts    Options

	mu  sync.Mutex
	cmd *exec.Cmd
	// probe is the connection CommandCalls reads stats on; one connection,
	// so that after the first call no handshake adds to the counts.
	probe *redis.Client
	admin *redis.Client
}

// Start runs a redis-server for the test and stops it at cleanup. A missing
// redis-server fails the test with InstallHint: it never skips.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	// The ports are held for the whole test (ports.Hold), so that no
	// other process takes one before the server binds it or while it is
	// down between Kill and Restart.
	s := &Server{t: t, bin: bin, dir: t.TempDir(), opts: opts, port: ports.HoldPort(t)}
	if opts.Cluster {
		s.busPort = ports.HoldPort(t)
	}
	if err := s.start(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Kill)
	return s
}

// Addr returns host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// TLS names a server's TLS material.
type TLS struct {
	CertFile, KeyFile, CAFile string
	// AuthClients requires a client certificate signed by CAFile.
	AuthClients bool
}

// TLSURL returns a rediss:// URL for the server's TLS port.
func (s *Server) TLSURL() string {
	return "rediss://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tlsPort)) + "/0"
}

// URL returns a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// BusPort returns the cluster bus port (zero outside cluster mode).
func (s *Server) BusPort() int { return s.busPort }

func (s *Server) start() error {
	var args []string
	if s.opts.Config != "" {
		conf := filepath.Join(s.dir, "redis.conf")
		// Sentinel rewrites its file; write it once, keep its changes
		// across restarts.
		if _, err := os.Stat(conf); err != nil {
			if err := os.WriteFile(conf, []byte(s.opts.Config), 0o600); err != nil {
				return err
			}
		}
		args = append(args, conf)
	}
	if s.opts.Sentinel {
		args = append(args, "--sentinel")
	}
	args = append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--daemonize", "no",
		"--loglevel", "warning",
		"--logfile", filepath.Join(s.dir, "redis.log"),
	)
	if s.opts.Password != "" {
		args = append(args, "--requirepass", s.opts.Password, "--masterauth", s.opts.Password)
	}
	if t := s.opts.TLS; t != nil {
		if s.tlsPort == 0 {
			s.tlsPort = ports.HoldPort(s.t)
		}
		auth := "no"
		if t.AuthClients {
			auth = "yes"
		}
		args = append(args, "--tls-port", strconv.Itoa(s.tlsPort), "--tls-cert-file", t.CertFile,
			"--tls-key-file", t.KeyFile, "--tls-ca-cert-file", t.CAFile, "--tls-auth-clients", auth)
	}
	if s.opts.Cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(s.busPort))
	}
	if s.opts.Persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	args = append(args, s.opts.Args...)
	cmd := exec.Command(s.bin, args...)
	// The server must not outlive a test binary that crashes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server exited during start (%v): %s", err, s.logTail())
		default:
		}
		if s.ping() == nil {
			s.mu.Lock()
			s.cmd = cmd
			s.mu.Unlock()
			go func() { <-exited }() // keep reaping; the channel is buffered
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	return fmt.Errorf("redis-server did not answer PING within 10s: %s", s.logTail())
}

func (s *Server) ping() error { return redisspec.Ping(s.Addr()) }

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// Kill stops the server at once with SIGKILL, as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	// Wait until the port is closed, so a test that kills and then calls
	// sees the failure it meant to cause.
	for range 500 {
		c, err := net.DialTimeout("tcp", s.Addr(), 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Restart starts a killed server again on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	var err error
	for range 50 { // the kernel may hold the port briefly
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart on port %d: %v", s.port, err)
}

// Client returns a go-redis client for direct inspection; it is closed at
// cleanup.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.opts.Password, DisableIdentity: true})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Do runs one command on the server through a connection kept for the
// helpers' own administration (CLUSTER, SENTINEL, INFO, ROLE).
func (s *Server) Do(ctx context.Context, args ...any) *redis.Cmd {
	s.mu.Lock()
	if s.admin == nil {
		s.admin = redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.opts.Password, DisableIdentity: true,
			PoolSize: 2, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 5 * time.Second})
		s.t.Cleanup(func() { _ = s.admin.Close() })
	}
	c := s.admin
	s.mu.Unlock()
	return c.Do(ctx, args...)
}

// Info returns one field of INFO section, "" when absent or unreachable.
func (s *Server) Info(ctx context.Context, section, field string) string {
	text, err := s.Do(ctx, "INFO", section).Text()
	if err != nil {
		return ""
	}
	return redisspec.InfoField(text, field)
}

// Running reports whether the process is up (not killed).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Freeze stops the process (SIGSTOP): it keeps its connections and
// accepts new ones, but answers nothing, as a hung server would. Thaw
// resumes it.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// CommandCalls returns the server's total command count from INFO
// commandstats, leaving out INFO itself (this method's own probe), so a
// test can show that some action issued no command at all. Take a first
// reading before the action: it opens the probe's connection.
func (s *Server) CommandCalls(ctx context.Context) (int64, error) {
	s.mu.Lock()
	if s.probe == nil {
		s.probe = redis.NewClient(&redis.Options{Addr: s.Addr(), Password: s.opts.Password, DisableIdentity: true, PoolSize: 1})
		s.t.Cleanup(func() { _ = s.probe.Close() })
	}
	c := s.probe
	s.mu.Unlock()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		if name == "cmdstat_info" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total, nil
}

// OpenStore opens the Redis store on url (any --redis-url form) with the
// daemon's client settings and budget per call, closed when the test ends.
func OpenStore(t testing.TB, url string, budget time.Duration) *redisstore.Store {
	t.Helper()
	rdb, err := redisstore.NewClient(url, budget)
	if err != nil {
		t.Fatal(err)
	}
	st := redisstore.New(rdb, redisstore.Options{CallTimeout: budget})
	t.Cleanup(func() {
		_ = st.Close()
		_ = rdb.Close()
	})
	return st
}

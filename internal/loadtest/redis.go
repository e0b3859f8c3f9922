package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/redis/go-redis/v9"
)

// redisServer is the Redis both idem-extproc and the floor server use:
// one the tool started, or one named by --redis-url.
type redisServer struct {
	url  string
	proc *server // nil for --redis-url
	rdb  *redis.Client
}

// startRedis runs redis-server ($REDIS_SERVER or the PATH's) on a free
// loopback port, without persistence, for the tool's lifetime.
func startRedis(dir string) (*redisServer, error) {
	bin := os.Getenv("REDIS_SERVER")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return nil, errors.New("redis-server not found in PATH (install it, set REDIS_SERVER, or pass --redis-url)")
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return nil, err
	}
	s, err := startProcess("redis-server", []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", rdir, "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
		"--maxmemory-policy", "noeviction"}, filepath.Join(dir, "redis.log"))
	if err != nil {
		return nil, err
	}
	r, err := openRedis(fmt.Sprintf("redis://127.0.0.1:%d/0", port))
	if err != nil {
		s.stop()
		return nil, err
	}
	r.proc = s
	if err := s.waitUntil(func() error { return r.rdb.Ping(context.Background()).Err() }); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func openRedis(url string) (*redisServer, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	opt.DisableIdentity = true
	opt.PoolSize = 2
	return &redisServer{url: url, rdb: redis.NewClient(opt)}, nil
}

func (r *redisServer) close() {
	_ = r.rdb.Close()
	if r.proc != nil {
		r.proc.stop()
	}
}

// flush empties the database between runs, so each starts alike.
func (r *redisServer) flush(ctx context.Context) error {
	return r.rdb.FlushDB(ctx).Err()
}

// cpu returns redis-server's CPU time, when the tool started it.
func (r *redisServer) cpu() (time.Duration, bool) {
	if r.proc == nil {
		return 0, false
	}
	d, err := processCPU(r.proc.pid())
	return d, err == nil
}

// info returns one field of INFO section, "" when absent.
func (r *redisServer) info(ctx context.Context, section, field string) string {
	text, err := r.rdb.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	return redisstore.InfoField(text, field)
}

func (r *redisServer) version(ctx context.Context) string {
	return r.info(ctx, "server", "redis_version")
}

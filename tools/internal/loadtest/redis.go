package loadtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisspec"
	"github.com/redis/go-redis/v9"
)

// redisServer is the Redis both idem-extproc and the floor server use:
// one the tool started, one named by --redis-url, or a Redis Cluster the
// tool started (nodes, each a primary; url is then redis+cluster://).
type redisServer struct {
	url  string
	proc *server // nil for --redis-url and a cluster
	// rdb is the standalone Redis's client, or the first node's.
	rdb *redis.Client
	// nodes are a cluster's processes, and clients their own clients.
	nodes   []*server
	clients []*redis.Client
}

// startRedis runs redis-server ($REDIS_SERVER or the PATH's) on a free
// loopback port, without persistence, for the tool's lifetime.
func startRedis(dir string) (*redisServer, error) {
	bin, err := redisBinary()
	if err != nil {
		return nil, err
	}
	var addr string
	s, err := startOnFreePorts(1, func(ports []int) (*server, error) {
		addr = loopback(ports[0])
		s, err := startRedisProcess(bin, ports[0], filepath.Join(dir, "redis"), filepath.Join(dir, "redis.log"))
		if err != nil {
			return nil, err
		}
		return s, s.waitUntil(redisReady(addr))
	})
	if err != nil {
		if s != nil {
			s.stop()
		}
		return nil, err
	}
	r, err := openRedis("redis://" + addr + "/0")
	if err != nil {
		s.stop()
		return nil, err
	}
	r.proc = s
	return r, nil
}

// redisBinary is $REDIS_SERVER or the PATH's redis-server.
func redisBinary() (string, error) {
	if bin := os.Getenv("REDIS_SERVER"); bin != "" {
		return bin, nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server not found in PATH (install it, set REDIS_SERVER, or pass --redis-url)")
	}
	return bin, nil
}

// startRedisProcess runs one redis-server on port without persistence,
// its files in dir; extra are further options (cluster mode).
func startRedisProcess(bin string, port int, dir, logPath string, extra ...string) (*server, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return startProcess("redis-server", append([]string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
		"--maxmemory-policy", "noeviction"}, extra...), logPath)
}

// startCluster runs a Redis Cluster of n primaries, no replicas, on
// loopback ports for the tool's lifetime, built as internal/testing/redistest's
// StartCluster builds the tests' (Cluster.create): each node in cluster
// mode with its own nodes.conf and bus port, an even share of the 16384
// slots each (CLUSTER ADDSLOTSRANGE), every node MEETing the first, then
// waiting until every node says cluster_state:ok with all 16384 slots
// served and knows all n nodes (CLUSTER INFO: redis/redis src/cluster.c,
// clusterCommand's "info" branch, prints cluster_state, cluster_slots_ok
// and cluster_known_nodes, the size of the node table). No replicas: the
// scale run compares the primaries' CPU with one standalone Redis's.
func startCluster(dir string, n int) (rs *redisServer, err error) {
	bin, err := redisBinary()
	if err != nil {
		return nil, err
	}
	rs = &redisServer{}
	defer func() {
		if err != nil {
			rs.close()
		}
	}()
	var addrs []string
	var busPorts []int
	for i := range n {
		var port, bus int
		s, err := startOnFreePorts(2, func(ports []int) (*server, error) {
			port, bus = ports[0], ports[1]
			ndir := filepath.Join(dir, fmt.Sprintf("redis-node%d", i))
			s, err := startRedisProcess(bin, port, ndir, filepath.Join(dir, fmt.Sprintf("redis-node%d.log", i)),
				"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus))
			if err != nil {
				return nil, err
			}
			return s, s.waitUntil(redisReady(loopback(port)))
		})
		if s != nil {
			rs.nodes = append(rs.nodes, s)
		}
		if err != nil {
			return nil, err
		}
		c, err := openRedis(fmt.Sprintf("redis://127.0.0.1:%d/0", port))
		if err != nil {
			return nil, err
		}
		rs.clients = append(rs.clients, c.rdb)
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", port))
		busPorts = append(busPorts, bus)
	}
	rs.rdb = rs.clients[0]
	rs.url = "redis+cluster://" + strings.Join(addrs, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	per := 16384 / n
	for i, c := range rs.clients {
		lo, hi := i*per, (i+1)*per-1
		if i == n-1 {
			hi = 16383
		}
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return nil, fmt.Errorf("cluster: ADDSLOTSRANGE on node %d: %w", i, err)
		}
	}
	firstPort := strings.TrimPrefix(addrs[0], "127.0.0.1:")
	for _, c := range rs.clients[1:] {
		if err := c.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", firstPort, busPorts[0]).Err(); err != nil {
			return nil, fmt.Errorf("cluster: MEET: %w", err)
		}
	}
	for {
		ok := true
		for _, c := range rs.clients {
			text, err := c.ClusterInfo(ctx).Result()
			if err != nil || redisspec.InfoField(text, "cluster_state") != "ok" ||
				redisspec.InfoField(text, "cluster_slots_ok") != "16384" ||
				redisspec.InfoField(text, "cluster_known_nodes") != strconv.Itoa(n) {
				ok = false
				break
			}
		}
		if ok {
			return rs, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster: not healthy within 60s: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// redisReady says whether a redis-server answers PING at addr: a port
// that only accepts connections may be another process's.
func redisReady(addr string) func() error { return func() error { return redisspec.Ping(addr) } }

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
	if len(r.clients) > 0 {
		for _, c := range r.clients {
			_ = c.Close()
		}
	} else if r.rdb != nil {
		_ = r.rdb.Close()
	}
	if r.proc != nil {
		r.proc.stop()
	}
	for _, n := range r.nodes {
		n.stop()
	}
}

// flush empties the database between runs, so each starts alike: on
// every node of a cluster, each holding its own slots' keys.
func (r *redisServer) flush(ctx context.Context) error {
	if len(r.clients) == 0 {
		return r.rdb.FlushDB(ctx).Err()
	}
	for _, c := range r.clients {
		if err := c.FlushDB(ctx).Err(); err != nil {
			return err
		}
	}
	return nil
}

// ownsProcesses reports whether the tool started this Redis, and so can
// read its CPU.
func (r *redisServer) ownsProcesses() bool {
	return r != nil && (r.proc != nil || len(r.nodes) > 0)
}

// cpu returns redis-server's CPU time, summed over a cluster's nodes,
// when the tool started it.
func (r *redisServer) cpu() (time.Duration, bool) {
	if !r.ownsProcesses() {
		return 0, false
	}
	procs := r.nodes
	if r.proc != nil {
		procs = []*server{r.proc}
	}
	var total time.Duration
	for _, p := range procs {
		d, err := procCPU(p.pid())
		if err != nil {
			return 0, false
		}
		total += d
	}
	return total, true
}

// info returns one field of INFO section, "" when absent.
func (r *redisServer) info(ctx context.Context, section, field string) string {
	text, err := r.rdb.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	return redisspec.InfoField(text, field)
}

func (r *redisServer) version(ctx context.Context) string {
	return r.info(ctx, "server", "redis_version")
}

package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisspec"
	"github.com/redis/go-redis/v9"
)

// ClusterOptions configures a Cluster.
type ClusterOptions struct {
	// Masters is the number of primaries (3 when zero); the 16384 slots
	// are split evenly between them.
	Masters int
	// ReplicasPerMaster is the number of replicas of each primary.
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout: how long a node may be
	// unreachable before a failover (1.5 s when zero).
	NodeTimeout time.Duration
	// Persist turns on the append-only file on every node.
	Persist bool
	// ProxyFirstMaster puts a LinkProxy in front of the first primary and
	// announces the proxy's port as that primary's address, so its
	// replicas (and clients) reach it through the proxy and its
	// replication can be frozen.
	ProxyFirstMaster bool
}

// Cluster is a Redis Cluster of redis-server processes on loopback ports,
// built in Go with CLUSTER ADDSLOTSRANGE, MEET and REPLICATE (no
// redis-cli needed).
type Cluster struct {
	t     testing.TB
	opts  ClusterOptions
	Nodes []*Server
	// Proxy is the first primary's LinkProxy (ProxyFirstMaster).
	Proxy *LinkProxy
}

// StartCluster starts the nodes, joins them, assigns slots and replicas,
// and waits until every node reports cluster_state:ok and every replica's
// link is up. Nodes are stopped at cleanup.
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if opts.Masters <= 0 {
		opts.Masters = 3
	}
	if opts.NodeTimeout <= 0 {
		opts.NodeTimeout = 1500 * time.Millisecond
	}
	c := &Cluster{t: t, opts: opts}
	args := []string{
		"--cluster-node-timeout", strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
		// A replica may always take over, however long its link was down:
		// tests fail primaries over on purpose.
		"--cluster-replica-validity-factor", "0",
		"--repl-diskless-sync-delay", "0",
	}
	if opts.ProxyFirstMaster {
		args = append(args, frozenLinkArgs...)
	}
	n := opts.Masters * (1 + opts.ReplicasPerMaster)
	for range n {
		c.Nodes = append(c.Nodes, Start(t, Options{Cluster: true, Persist: opts.Persist, Args: args}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if opts.ProxyFirstMaster {
		// The ports are known only once the node runs: announce the
		// proxy's with CONFIG SET before the node meets the others.
		c.Proxy = NewLinkProxy(t)
		m := c.Nodes[0]
		c.Proxy.SetTargetPort(m.Port())
		for _, kv := range [][2]string{
			{"cluster-announce-port", strconv.Itoa(c.Proxy.Port())},
			{"cluster-announce-bus-port", strconv.Itoa(m.BusPort())},
		} {
			if err := m.Do(ctx, "CONFIG", "SET", kv[0], kv[1]).Err(); err != nil {
				t.Fatalf("redistest: cluster: CONFIG SET %s: %v", kv[0], err)
			}
		}
		// Restarts must announce the same.
		m.opts.Args = append(append([]string(nil), m.opts.Args...),
			"--cluster-announce-port", strconv.Itoa(c.Proxy.Port()),
			"--cluster-announce-bus-port", strconv.Itoa(m.BusPort()))
	}
	if err := c.create(ctx); err != nil {
		t.Fatalf("redistest: cluster: %v", err)
	}
	return c
}

func (c *Cluster) create(ctx context.Context) error {
	m := c.opts.Masters
	per := 16384 / m
	for i := range m {
		lo, hi := i*per, (i+1)*per-1
		if i == m-1 {
			hi = 16383
		}
		if err := c.Nodes[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("ADDSLOTSRANGE on node %d: %w", i, err)
		}
	}
	first := c.Nodes[0]
	for _, s := range c.Nodes[1:] {
		if err := s.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", first.Port(), first.BusPort()).Err(); err != nil {
			return fmt.Errorf("MEET: %w", err)
		}
	}
	if err := c.waitFor(ctx, "every node knows every other", func() bool {
		for _, s := range c.Nodes {
			nodes, err := c.nodes(ctx, s)
			if err != nil || len(nodes) != len(c.Nodes) {
				return false
			}
			for _, n := range nodes {
				if strings.Contains(n.flags, "handshake") || strings.Contains(n.flags, "noaddr") {
					return false
				}
			}
		}
		return true
	}); err != nil {
		return err
	}
	for i := range m {
		id, err := c.Nodes[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return err
		}
		for r := range c.opts.ReplicasPerMaster {
			replica := c.Nodes[m+i*c.opts.ReplicasPerMaster+r]
			if err := replica.Do(ctx, "CLUSTER", "REPLICATE", id).Err(); err != nil {
				return fmt.Errorf("REPLICATE: %w", err)
			}
		}
	}
	return c.WaitHealthy(ctx)
}

// URL returns a redis+cluster:// URL naming every node.
func (c *Cluster) URL() string {
	addrs := make([]string, 0, len(c.Nodes))
	for _, s := range c.Nodes {
		addrs = append(addrs, s.Addr())
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, flags, master string
	port                    int
	slots                   string
}

func (c *Cluster) nodes(ctx context.Context, s *Server) ([]clusterNode, error) {
	text, err := s.Do(ctx, "CLUSTER", "NODES").Text()
	if err != nil {
		return nil, err
	}
	var out []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := clusterNode{id: f[0], addr: f[1], flags: f[2], master: f[3]}
		hostport, _, _ := strings.Cut(n.addr, "@")
		if i := strings.LastIndex(hostport, ":"); i >= 0 {
			n.port, _ = strconv.Atoi(hostport[i+1:])
		}
		if len(f) > 8 {
			n.slots = strings.Join(f[8:], " ")
		}
		out = append(out, n)
	}
	return out, nil
}

// serverAt maps an announced port to its node.
func (c *Cluster) serverAt(port int) *Server {
	if c.Proxy != nil && port == c.Proxy.Port() {
		return c.Nodes[0]
	}
	for _, s := range c.Nodes {
		if s.Port() == port {
			return s
		}
	}
	return nil
}

// WaitHealthy waits until every running node says cluster_state:ok, every
// slot is served, every running replica's link to its primary is up, and
// all running nodes agree on who the primaries are.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	return c.waitFor(ctx, "cluster healthy", func() bool {
		var view string
		for _, s := range c.Nodes {
			if !s.Running() {
				continue
			}
			if clusterInfo(ctx, s, "cluster_state") != "ok" || clusterInfo(ctx, s, "cluster_slots_ok") != "16384" {
				return false
			}
			if s.Info(ctx, "replication", "role") == "slave" && s.Info(ctx, "replication", "master_link_status") != "up" {
				return false
			}
			nodes, err := c.nodes(ctx, s)
			if err != nil {
				return false
			}
			var masters []string
			for _, n := range nodes {
				if strings.Contains(n.flags, "master") && !strings.Contains(n.flags, "fail") && n.slots != "" {
					masters = append(masters, n.id)
				}
			}
			if len(masters) != c.opts.Masters {
				return false
			}
			v := strings.Join(sorted(masters), ",")
			if view != "" && v != view {
				return false
			}
			view = v
		}
		return true
	})
}

// clusterInfo returns one field of CLUSTER INFO.
func clusterInfo(ctx context.Context, s *Server, field string) string {
	text, err := s.Do(ctx, "CLUSTER", "INFO").Text()
	if err != nil {
		return ""
	}
	return redisspec.InfoField(text, field)
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// MasterFor returns the node that serves key's slot now.
func (c *Cluster) MasterFor(ctx context.Context, key string) *Server {
	c.t.Helper()
	slot := redisspec.Slot(key)
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		nodes, err := c.nodes(ctx, s)
		if err != nil {
			continue
		}
		for _, n := range nodes {
			if !strings.Contains(n.flags, "master") || strings.Contains(n.flags, "fail") {
				continue
			}
			for _, r := range strings.Fields(n.slots) {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				a, err1 := strconv.Atoi(lo)
				b, err2 := strconv.Atoi(hi)
				if err1 == nil && err2 == nil && slot >= a && slot <= b {
					return c.serverAt(n.port)
				}
			}
		}
	}
	c.t.Fatalf("redistest: no primary serves slot %d", slot)
	return nil
}

// ReplicaOf returns a replica of the given primary, waiting until the
// primary's view of the cluster shows one.
func (c *Cluster) ReplicaOf(ctx context.Context, master *Server) *Server {
	c.t.Helper()
	id, err := master.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		c.t.Fatalf("redistest: MYID: %v", err)
	}
	var replica *Server
	err = waitFor(ctx, "a replica of "+master.Addr(), func() bool {
		nodes, err := c.nodes(ctx, master)
		if err != nil {
			return false
		}
		for _, n := range nodes {
			if n.master == id && !strings.Contains(n.flags, "fail") {
				if s := c.serverAt(n.port); s != nil && s.Running() &&
					s.Info(ctx, "replication", "master_link_status") == "up" {
					replica = s
					return true
				}
			}
		}
		return false
	})
	if err != nil {
		c.t.Fatalf("%v; the primary's log ends:\n%s", err, master.logTail())
	}
	return replica
}

// Failover runs CLUSTER FAILOVER on a replica of master (a coordinated
// switch: the primary stops writes until the replica caught up) and waits
// until the replica serves and the cluster is healthy. It returns the new
// primary.
func (c *Cluster) Failover(ctx context.Context, master *Server, mode ...string) *Server {
	c.t.Helper()
	replica := c.ReplicaOf(ctx, master)
	args := []any{"CLUSTER", "FAILOVER"}
	for _, m := range mode {
		args = append(args, m)
	}
	// A manual failover the replica cannot finish within CLUSTER_MF_TIMEOUT
	// (5000 ms, Redis cluster.h) is aborted with only a log line ("Manual
	// failover timed out."), which happens when a loaded machine delays the
	// primary's offset: the replica then never turns primary. So the command
	// is given again after twice that time, as an operator would.
	for {
		if err := replica.Do(ctx, args...).Err(); err != nil {
			c.t.Fatalf("redistest: CLUSTER FAILOVER: %v", err)
		}
		attempt, cancel := context.WithTimeout(ctx, 2*manualFailoverTimeout)
		err := c.waitFor(attempt, "replica promoted", func() bool {
			return replica.Info(ctx, "replication", "role") == "master"
		})
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		c.t.Logf("redistest: CLUSTER FAILOVER not done in %v; giving it again", 2*manualFailoverTimeout)
	}
	return c.awaitPromotion(ctx, replica, "replica promoted")
}

// manualFailoverTimeout is Redis's CLUSTER_MF_TIMEOUT (cluster.h): how long
// a replica has to complete a CLUSTER FAILOVER before it gives up.
const manualFailoverTimeout = 5 * time.Second

// KillMaster kills master's process and waits until its replica has been
// elected in its place and the cluster is healthy again. It returns the
// new primary; the old one stays down until Restart.
func (c *Cluster) KillMaster(ctx context.Context, master *Server) *Server {
	c.t.Helper()
	replica := c.ReplicaOf(ctx, master)
	master.Kill()
	if c.Proxy != nil && master == c.Nodes[0] {
		c.Proxy.Cut()
	}
	return c.awaitPromotion(ctx, replica, "replica elected after the primary died")
}

// awaitPromotion waits until replica reports itself a primary and the
// cluster is healthy again, and returns it.
func (c *Cluster) awaitPromotion(ctx context.Context, replica *Server, what string) *Server {
	c.t.Helper()
	if err := c.waitFor(ctx, what, func() bool {
		return replica.Info(ctx, "replication", "role") == "master"
	}); err != nil {
		c.t.Fatal(err)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		c.t.Fatal(err)
	}
	return replica
}

// Rejoin restarts a killed node and waits until it is back as a replica
// with its link up and the cluster is healthy.
func (c *Cluster) Rejoin(ctx context.Context, s *Server) {
	c.t.Helper()
	s.Restart()
	if err := c.waitFor(ctx, "node rejoined as a replica", func() bool {
		return s.Info(ctx, "replication", "role") == "slave" && s.Info(ctx, "replication", "master_link_status") == "up"
	}); err != nil {
		c.t.Fatalf("%v; the node's log ends:\n%s", err, s.logTail())
	}
	if err := c.WaitHealthy(ctx); err != nil {
		c.t.Fatal(err)
	}
}

// Client returns a cluster client for direct inspection, closed at
// cleanup.
func (c *Cluster) Client() *redis.ClusterClient {
	addrs := make([]string, 0, len(c.Nodes))
	for _, s := range c.Nodes {
		addrs = append(addrs, s.Addr())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DisableIdentity: true})
	c.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func (c *Cluster) waitFor(ctx context.Context, what string, cond func() bool) error {
	return waitFor(ctx, what, cond)
}

func waitFor(ctx context.Context, what string, cond func() bool) error {
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: %s: not reached: %w", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

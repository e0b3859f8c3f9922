package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

func checkOne(t *testing.T, c *redisstore.SafetyChecker) redisstore.NodeSafety {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := c.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 {
		t.Fatalf("%d nodes, want 1: %+v", len(nodes), nodes)
	}
	if nodes[0].Err != nil {
		t.Fatal(nodes[0].Err)
	}
	return nodes[0]
}

// TestSafetyReadsEachSetting: every case runs on its own redis-server
// started with the setting under test; the check reads it from INFO (and
// CONFIG GET save, or INFO's snapshot counters when CONFIG is renamed away).
func TestSafetyReadsEachSetting(t *testing.T) {
	for _, tc := range []struct {
		name        string
		args        []string
		persist     bool
		policy      string
		evicting    bool
		persistence redisstore.Persistence
	}{
		{name: "defaults of the tests' servers", policy: "noeviction", persistence: redisstore.PersistenceNone},
		{name: "allkeys-lru", args: []string{"--maxmemory-policy", "allkeys-lru"}, policy: "allkeys-lru", evicting: true, persistence: redisstore.PersistenceNone},
		{name: "volatile-lru, a managed default", args: []string{"--maxmemory-policy", "volatile-lru"}, policy: "volatile-lru", evicting: true, persistence: redisstore.PersistenceNone},
		{name: "append-only file", persist: true, policy: "noeviction", persistence: redisstore.PersistenceAOF},
		{name: "RDB save points", args: []string{"--save", "3600 1"}, policy: "noeviction", persistence: redisstore.PersistenceRDB},
		{name: "CONFIG renamed away, no snapshot yet", args: []string{"--save", "3600 1", "--rename-command", "CONFIG", ""}, policy: "noeviction", persistence: redisstore.PersistenceUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{Args: tc.args, Persist: tc.persist})
			n := checkOne(t, redistest.OpenStore(t, srv.URL(), time.Second).NewSafetyChecker())
			if n.MaxmemoryPolicy != tc.policy || n.Evicting() != tc.evicting || n.Persistence != tc.persistence {
				t.Fatalf("got policy %q (evicting %v), persistence %q; want %q (%v), %q",
					n.MaxmemoryPolicy, n.Evicting(), n.Persistence, tc.policy, tc.evicting, tc.persistence)
			}
			if n.Replicas != 0 || n.Addr != srv.Addr() {
				t.Fatalf("replicas %d at %s, want 0 at %s", n.Replicas, n.Addr, srv.Addr())
			}
			if want := tc.persistence == redisstore.PersistenceNone || tc.persistence == redisstore.PersistenceUnknown; n.Volatile() != want {
				t.Fatalf("Volatile() = %v, want %v", n.Volatile(), want)
			}
		})
	}
}

// TestSafetySnapshotCountsWithoutConfig: with CONFIG refused, a snapshot
// INFO reports shows RDB persistence.
func TestSafetySnapshotCountsWithoutConfig(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{Args: []string{"--save", "3600 1", "--rename-command", "CONFIG", ""}})
	ctx := context.Background()
	if err := srv.Do(ctx, "BGSAVE").Err(); err != nil {
		t.Fatal(err)
	}
	// rdb_saves counts a save when its child is forked (redis/redis
	// src/rdb.c, rdbSaveBackground); the test ends, and its directory is
	// removed, only once the child has written the file and gone.
	testwait.Until(t, "the snapshot", func() bool {
		return srv.Info(ctx, "persistence", "rdb_saves") == "1" && srv.Info(ctx, "persistence", "rdb_bgsave_in_progress") == "0"
	})
	if n := checkOne(t, redistest.OpenStore(t, srv.URL(), time.Second).NewSafetyChecker()); n.Persistence != redisstore.PersistenceRDB {
		t.Fatalf("persistence %q, want rdb", n.Persistence)
	}
}

// TestSafetyCountsReplicas: a primary with a replica is not volatile even
// without persistence, and the replica's own maxmemory-policy is read.
func TestSafetyCountsReplicas(t *testing.T) {
	primary := redistest.Start(t, redistest.Options{})
	replica := redistest.Start(t, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()),
		"--maxmemory-policy", "allkeys-lru"}})
	ctx := context.Background()
	testwait.Until(t, "the replica", func() bool { return primary.Info(ctx, "replication", "connected_slaves") == "1" })
	nodes, err := redistest.OpenStore(t, primary.URL(), time.Second).NewSafetyChecker().Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].Replicas != 1 || nodes[0].Volatile() || nodes[0].Replica {
		t.Fatalf("primary %+v; want 1 replica, not volatile", nodes)
	}
	if r := nodes[1]; !r.Replica || r.Addr != replica.Addr() || r.Err != nil || r.MaxmemoryPolicy != "allkeys-lru" || !r.Evicting() || r.Volatile() {
		t.Fatalf("replica %+v; want %s with allkeys-lru", r, replica.Addr())
	}
}

// TestSafetyNoticesAVanishedDataset: the marker written at the first check
// is read at the next; FLUSHALL, or a restart without persistence, makes
// every checker sharing the Redis report the loss once.
func TestSafetyNoticesAVanishedDataset(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	a := redistest.OpenStore(t, srv.URL(), time.Second).NewSafetyChecker()
	b := redistest.OpenStore(t, srv.URL(), time.Second).NewSafetyChecker()
	for _, c := range []*redisstore.SafetyChecker{a, b, a, b} {
		if n := checkOne(t, c); n.DatasetLost {
			t.Fatal("a fresh dataset reported lost")
		}
	}
	ctx := context.Background()
	if ttl := srv.Client().TTL(ctx, "idem:{marker:0}").Val(); ttl != -1 {
		t.Fatalf("marker TTL %v, want none (-1)", ttl)
	}
	if err := srv.Do(ctx, "FLUSHALL").Err(); err != nil {
		t.Fatal(err)
	}
	// a writes a new marker; b sees it replaced: both report the loss.
	for _, c := range []*redisstore.SafetyChecker{a, b} {
		if n := checkOne(t, c); !n.DatasetLost {
			t.Fatal("FLUSHALL not reported")
		}
	}
	for _, c := range []*redisstore.SafetyChecker{a, b} {
		if n := checkOne(t, c); n.DatasetLost {
			t.Fatal("one loss reported twice")
		}
	}
	srv.Kill()
	srv.Restart() // no persistence: comes back empty
	if n := checkOne(t, a); !n.DatasetLost {
		t.Fatal("a restart that lost the data not reported")
	}
}

// TestSafetyCluster: every node is checked, each shard gets its own
// marker on its master, a loss on one shard is reported for it alone, and
// a replica's evicting policy (in force once it is promoted) is seen.
func TestSafetyCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	chk := redistest.OpenStore(t, c.URL(), time.Second).NewSafetyChecker()
	check := func() map[string]redisstore.NodeSafety {
		t.Helper()
		nodes, err := chk.Check(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]redisstore.NodeSafety{}
		for _, n := range nodes {
			if n.Err != nil {
				t.Fatal(n.Err)
			}
			if !n.Replica {
				out[n.Addr] = n
			}
		}
		if len(out) != 3 || len(nodes) != 6 {
			t.Fatalf("%d masters of %d nodes checked, want 3 of 6: %+v", len(out), len(nodes), nodes)
		}
		return out
	}
	for _, n := range check() {
		if n.DatasetLost || n.MaxmemoryPolicy != "noeviction" || n.Replicas != 1 || n.Volatile() {
			t.Fatalf("fresh cluster: %+v", n)
		}
	}
	var victim *redistest.Server
	for _, s := range c.Nodes {
		if role := s.Info(ctx, "replication", "role"); role != "master" {
			continue
		}
		keys, err := s.Client().Keys(ctx, "idem:{marker:*}").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 {
			t.Fatalf("master %s holds markers %q, want one", s.Addr(), keys)
		}
		if m := c.MasterFor(ctx, keys[0]); m != s {
			t.Fatalf("marker %s on %s, but its slot is served by %s", keys[0], s.Addr(), m.Addr())
		}
		victim = s
	}
	if err := victim.Do(ctx, "FLUSHALL").Err(); err != nil {
		t.Fatal(err)
	}
	for addr, n := range check() {
		if n.DatasetLost != (addr == victim.Addr()) {
			t.Fatalf("%s: lost = %v; only %s was flushed", addr, n.DatasetLost, victim.Addr())
		}
	}

	replica := c.ReplicaOf(ctx, victim)
	if err := replica.Do(ctx, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	nodes, err := chk.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Evicting() != (n.Addr == replica.Addr()) {
			t.Fatalf("%s (replica %v): evicting = %v; only the replica %s was set to allkeys-lru", n.Addr, n.Replica, n.Evicting(), replica.Addr())
		}
	}
}

// TestSafetySentinel: behind Sentinel the primary is checked, with its
// replica.
func TestSafetySentinel(t *testing.T) {
	g := redistest.StartSentinel(t, redistest.SentinelOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodes, err := redistest.OpenStore(t, g.URL(), time.Second).NewSafetyChecker().Check(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("%+v, %v; want the primary and its replica", nodes, err)
	}
	n := nodes[0]
	if m := g.Master(ctx); n.Addr != m.Addr() || n.Replicas != 1 {
		t.Fatalf("checked %s with %d replicas; want the primary %s with 1", n.Addr, n.Replicas, m.Addr())
	}
	if r := nodes[1]; !r.Replica || r.Addr != g.Other(g.Master(ctx)).Addr() || r.Err != nil || r.MaxmemoryPolicy != "noeviction" {
		t.Fatalf("replica %+v", r)
	}
}

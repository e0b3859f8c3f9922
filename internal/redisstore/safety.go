package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/redisspec"
	"github.com/redis/go-redis/v9"
)

// Persistence is how a Redis primary keeps its data across a restart.
type Persistence string

// The kinds of Persistence.
const (
	// PersistenceAOF: the append-only file is on (INFO aof_enabled:1).
	PersistenceAOF Persistence = "aof"
	// PersistenceRDB: RDB snapshots are configured (CONFIG GET save), or
	// where CONFIG is refused, INFO shows one was taken.
	PersistenceRDB Persistence = "rdb"
	// PersistenceNone: no append-only file and no save points.
	PersistenceNone Persistence = "none"
	// PersistenceUnknown: no append-only file, CONFIG is refused and INFO
	// shows no snapshot: the save points cannot be read.
	PersistenceUnknown Persistence = "unknown"
)

// NodeSafety is what one primary of the store said at a check.
type NodeSafety struct {
	// Addr is the primary's address as the client reaches it.
	Addr string
	// MaxmemoryPolicy is INFO's maxmemory_policy (noeviction, allkeys-lru,
	// volatile-lru, …).
	MaxmemoryPolicy string
	Persistence     Persistence
	// Replicas is INFO's connected_slaves.
	Replicas int
	// Replica: the node is a replica of a primary checked before it. Only
	// its maxmemory-policy is read (it applies once a failover promotes
	// it); the marker, the persistence and the replicas are its primary's.
	Replica bool
	// DatasetLost: the shard's marker record, seen at an earlier check, was
	// gone or replaced by another: the data it sat with vanished (a
	// restart without persistence, a failover to an empty replica, a
	// FLUSHALL, eviction).
	DatasetLost bool
	// Err is why the node could not be checked; the other fields are then
	// unset.
	Err error
}

// Evicting reports a maxmemory-policy that may delete keys before their
// TTL: anything but noeviction. Every record has a TTL, so the volatile-*
// policies (often a managed service's default) evict records too.
func (n NodeSafety) Evicting() bool {
	return n.MaxmemoryPolicy != "" && n.MaxmemoryPolicy != "noeviction"
}

// Volatile reports a primary whose data one restart loses: no
// persistence that could be confirmed and no replica.
func (n NodeSafety) Volatile() bool {
	return n.Err == nil && !n.Replica && n.Replicas == 0 && (n.Persistence == PersistenceNone || n.Persistence == PersistenceUnknown)
}

// SafetyChecker reads, primary by primary, what the store's Redis says
// about keeping records, and watches one marker record per shard to notice
// a dataset that vanished. Everything it reads comes from INFO, which
// managed services leave enabled when they rename or refuse CONFIG; only
// the RDB save points are not in INFO (its persistence section has
// rdb_changes_since_last_save, rdb_last_bgsave_status, rdb_saves, … but no
// save parameters: redis/redis-doc commands/info.md, and INFO persistence
// of redis-server 7.0), so they are asked with CONFIG GET save when it is
// allowed.
//
// The marker is a key without TTL beside the records (the store's prefix,
// a hash tag of the shard's slots), written once with SET NX: every server
// sharing the Redis reads the same one. A checker remembers the value it
// last read per shard; a marker gone, or replaced by another server's new
// one, means the shard's data vanished since.
type SafetyChecker struct {
	s    *Store
	mu   sync.Mutex
	seen map[string]string // marker key → value last read
}

// NewSafetyChecker returns a checker of s's Redis.
func (s *Store) NewSafetyChecker() *SafetyChecker {
	return &SafetyChecker{s: s, seen: map[string]string{}}
}

// MarkerKey returns the marker record's key for the shard that serves
// hashTag: beside the records (the store's prefix, a {hash tag}), never
// the key of a record (record ids are hex digests).
func (s *Store) MarkerKey(hashTag string) string { return s.prefix + "{" + hashTag + "}" }

// markerTag is the hash tag of the marker on a single primary.
const markerTag = "marker:0"

// Check reads every primary once: the primary behind a Sentinel or a
// single server, every master of a Cluster; and, for its maxmemory-policy
// only, every replica a primary's INFO lists. It fails only when no
// primary could be listed; a node that cannot be read has its Err set.
func (c *SafetyChecker) Check(ctx context.Context) ([]NodeSafety, error) {
	cc, ok := c.s.rdb.(*redis.ClusterClient)
	if !ok {
		cl, ok := c.s.rdb.(*redis.Client) // a single server, or the Sentinel-managed primary
		if !ok {
			return nil, fmt.Errorf("redisstore: safety check: unsupported client %T", c.s.rdb)
		}
		nodes := c.checkPrimary(ctx, cl, markerTag)
		if nodes[0].Err != nil {
			return nil, nodes[0].Err
		}
		return nodes, nil
	}
	var (
		mu    sync.Mutex
		nodes []NodeSafety
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, cl *redis.Client) error {
		var found []NodeSafety
		if tag, err := ownedTag(ctx, cl); err != nil {
			found = []NodeSafety{{Addr: cl.Options().Addr, Err: err}}
		} else {
			found = c.checkPrimary(ctx, cl, tag)
		}
		mu.Lock()
		nodes = append(nodes, found...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstore: safety check: %w", err)
	}
	if len(nodes) == 0 {
		return nil, errors.New("redisstore: safety check: the cluster lists no master")
	}
	return nodes, nil
}

// checkPrimary checks a primary, then each replica INFO lists for it: a
// replica's maxmemory-policy applies once a failover promotes it.
func (c *SafetyChecker) checkPrimary(ctx context.Context, cl *redis.Client, tag string) []NodeSafety {
	n, info := c.checkNode(ctx, cl, tag)
	nodes := []NodeSafety{n}
	if n.Err != nil {
		return nodes
	}
	for _, addr := range replicaAddrs(info) {
		nodes = append(nodes, checkReplica(ctx, cl, addr))
	}
	return nodes
}

// replicaAddrs reads the replicas from INFO replication's
// "slave0:ip=…,port=…,state=…" lines.
func replicaAddrs(info string) []string {
	var addrs []string
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if n, isSlave := strings.CutPrefix(k, "slave"); !ok || !isSlave || n == "" || strings.Trim(n, "0123456789") != "" {
			continue // not a slave<N> line
		}
		var ip, port string
		for _, kv := range strings.Split(v, ",") {
			switch name, val, _ := strings.Cut(kv, "="); name {
			case "ip":
				ip = val
			case "port":
				port = val
			}
		}
		if ip != "" && port != "" {
			addrs = append(addrs, net.JoinHostPort(ip, port))
		}
	}
	return addrs
}

// checkReplica reads a replica's maxmemory-policy over a short-lived
// client with the primary's credentials and TLS settings.
func checkReplica(ctx context.Context, primary *redis.Client, addr string) NodeSafety {
	n := NodeSafety{Addr: addr, Replica: true}
	opts := *primary.Options()
	opts.Addr = addr
	// The Sentinel client dials the current primary whatever the address;
	// a replica is dialled directly.
	opts.Dialer, opts.OnConnect = nil, nil
	opts.PoolSize = 1
	rc := redis.NewClient(&opts)
	defer rc.Close()
	info, err := rc.Info(ctx, "memory").Result()
	if err != nil {
		n.Err = fmt.Errorf("redisstore: INFO on replica %s: %w", addr, err)
		return n
	}
	n.MaxmemoryPolicy = redisspec.InfoField(info, "maxmemory_policy")
	return n
}

func (c *SafetyChecker) checkNode(ctx context.Context, cl *redis.Client, tag string) (NodeSafety, string) {
	n := NodeSafety{Addr: nodeAddr(ctx, cl)}
	info, err := cl.Info(ctx, "memory", "persistence", "replication").Result()
	if err != nil {
		// Redis before 7.0 takes one section only; the default sections
		// hold all three.
		if info, err = cl.Info(ctx).Result(); err != nil {
			n.Err = fmt.Errorf("redisstore: INFO on %s: %w", n.Addr, err)
			return n, ""
		}
	}
	n.MaxmemoryPolicy = redisspec.InfoField(info, "maxmemory_policy")
	n.Replicas, _ = strconv.Atoi(redisspec.InfoField(info, "connected_slaves"))
	n.Persistence = persistenceOf(ctx, cl, info)
	lost, err := c.checkMarker(ctx, cl, c.s.MarkerKey(tag))
	if err != nil {
		n.Err = fmt.Errorf("redisstore: marker record on %s: %w", n.Addr, err)
		return n, ""
	}
	n.DatasetLost = lost
	return n, info
}

// nodeAddr names the server cl reaches. go-redis's Sentinel client calls
// itself "FailoverClient" (sentinel.go, FailoverOptions.clientOptions), so
// its primary is named by the address its connection reached, from CLIENT
// INFO's laddr (Redis 6.2 and later).
func nodeAddr(ctx context.Context, cl *redis.Client) string {
	addr := cl.Options().Addr
	if addr != "FailoverClient" {
		return addr
	}
	if info, err := cl.ClientInfo(ctx).Result(); err == nil && info.LAddr != "" {
		return info.LAddr
	}
	return "sentinel-primary"
}

// persistenceOf reads how a primary persists: aof_enabled from INFO, then
// the save points from CONFIG GET save; where CONFIG is refused, an RDB
// snapshot INFO reports (rdb_saves, or rdb_last_bgsave_time_sec, -1 until
// the first) shows snapshots are taken.
func persistenceOf(ctx context.Context, cl *redis.Client, info string) Persistence {
	if redisspec.InfoField(info, "aof_enabled") == "1" {
		return PersistenceAOF
	}
	if cfg, err := cl.ConfigGet(ctx, "save").Result(); err == nil {
		if strings.TrimSpace(cfg["save"]) != "" {
			return PersistenceRDB
		}
		return PersistenceNone
	}
	if n, _ := strconv.Atoi(redisspec.InfoField(info, "rdb_saves")); n > 0 {
		return PersistenceRDB
	}
	if s := redisspec.InfoField(info, "rdb_last_bgsave_time_sec"); s != "" && s != "-1" {
		return PersistenceRDB
	}
	return PersistenceUnknown
}

// checkMarker reads the shard's marker, writing it when absent, and
// reports whether the one seen before is gone.
func (c *SafetyChecker) checkMarker(ctx context.Context, cl *redis.Client, key string) (lost bool, err error) {
	c.mu.Lock()
	prev, known := c.seen[key]
	c.mu.Unlock()
	v, err := cl.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		// SET NX: when servers race, one value wins and all read it.
		if err := cl.SetNX(ctx, key, newMarkerValue(), 0).Err(); err != nil {
			return false, err
		}
		v, err = cl.Get(ctx, key).Result()
	}
	if err != nil {
		return false, err
	}
	c.mu.Lock()
	c.seen[key] = v
	c.mu.Unlock()
	return known && v != prev, nil
}

func newMarkerValue() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:]) + " " + time.Now().UTC().Format(time.RFC3339)
}

// ownedTag returns a hash tag whose slot the master cl serves, read from
// its own CLUSTER NODES line ("myself"), so that the marker written on it
// is the shard's.
func ownedTag(ctx context.Context, cl *redis.Client) (string, error) {
	text, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: CLUSTER NODES on %s: %w", cl.Options().Addr, err)
	}
	var ranges [][2]int
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "myself") {
			continue
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated or imported
			}
			lo, hi, found := strings.Cut(r, "-")
			a, err1 := strconv.Atoi(lo)
			b := a
			var err2 error
			if found {
				b, err2 = strconv.Atoi(hi)
			}
			if err1 == nil && err2 == nil {
				ranges = append(ranges, [2]int{a, b})
			}
		}
	}
	if len(ranges) == 0 {
		return "", fmt.Errorf("redisstore: %s serves no slot", cl.Options().Addr)
	}
	for i := 0; i < 1<<20; i++ {
		tag := "marker:" + strconv.Itoa(i)
		slot := redisspec.Slot(tag)
		for _, r := range ranges {
			if slot >= r[0] && slot <= r[1] {
				return tag, nil
			}
		}
	}
	return "", fmt.Errorf("redisstore: no marker tag maps to the slots of %s", cl.Options().Addr)
}

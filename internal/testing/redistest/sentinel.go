package redistest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelOptions configures a SentinelGroup.
type SentinelOptions struct {
	// MasterName is the monitored name ("mymaster" when empty).
	MasterName string
	// Password protects the data nodes (requirepass, masterauth; the
	// Sentinels use it as auth-pass).
	Password string
	// SentinelPassword protects the Sentinels themselves.
	SentinelPassword string
	// Persist turns on the append-only file on the data nodes.
	Persist bool
	// ProxyReplication makes the replica reach its primary through a
	// LinkProxy, so the test can freeze replication.
	ProxyReplication bool
}

// SentinelGroup is a primary, one replica and three Sentinels (quorum 2),
// all redis-server processes on loopback ports.
type SentinelGroup struct {
	t    testing.TB
	opts SentinelOptions
	// Data holds the two data nodes; which is primary changes with
	// failovers (see Master).
	Data      []*Server
	Sentinels []*Server
	Proxy     *LinkProxy
}

// StartSentinel starts the group and waits until the replica is in sync
// and every Sentinel knows the replica and the two other Sentinels, so a
// failover can be agreed at once. Everything stops at cleanup.
func StartSentinel(t testing.TB, opts SentinelOptions) *SentinelGroup {
	t.Helper()
	if opts.MasterName == "" {
		opts.MasterName = "mymaster"
	}
	g := &SentinelGroup{t: t, opts: opts}
	// A replica's first sync starts at once, not after the default 5 s.
	args := []string{"--repl-diskless-sync-delay", "0"}
	if opts.ProxyReplication {
		args = append(args, frozenLinkArgs...)
	}
	master := Start(t, Options{Persist: opts.Persist, Password: opts.Password, Args: args})
	upstream := master.Port()
	if opts.ProxyReplication {
		g.Proxy = NewLinkProxy(t)
		g.Proxy.SetTargetPort(master.Port())
		upstream = g.Proxy.Port()
	}
	replica := Start(t, Options{Persist: opts.Persist, Password: opts.Password,
		Args: append(slices.Clip(args), "--replicaof", "127.0.0.1", strconv.Itoa(upstream))})
	g.Data = []*Server{master, replica}

	// A primary that has not answered the Sentinels' pings for
	// down-after-milliseconds is down (redis/redis src/sentinel.c,
	// sentinelCheckSubjectivelyDown). With replication through the proxy,
	// the test needs the proxied primary to stay primary until it kills
	// it: one failed over because a busy machine stalled it for a second
	// comes back replicating from the new primary directly, and the lag
	// the proxy models is gone. Such a group waits 5 s instead of 1.
	downAfter := 1000
	if opts.ProxyReplication {
		downAfter = 5000
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]d 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		// Long enough that Sentinel never "fixes" a proxied replica's
		// primary address during a test, short enough not to matter.
		"sentinel failover-timeout %[1]s 60000\n"+
		"sentinel parallel-syncs %[1]s 1\n", opts.MasterName, master.Port(), downAfter)
	if opts.Password != "" {
		conf += fmt.Sprintf("sentinel auth-pass %s %s\n", opts.MasterName, opts.Password)
	}
	if opts.SentinelPassword != "" {
		conf += fmt.Sprintf("requirepass %s\nsentinel sentinel-pass %s\n", opts.SentinelPassword, opts.SentinelPassword)
	}
	for range 3 {
		g.Sentinels = append(g.Sentinels, Start(t, Options{Config: conf, Sentinel: true, Password: opts.SentinelPassword}))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := g.waitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, "every Sentinel knows the replica and the others", func() bool {
		for _, s := range g.Sentinels {
			m, err := g.sentinelMaster(ctx, s)
			if err != nil || m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return g
}

// URL returns the redis+sentinel:// URL of the group.
func (g *SentinelGroup) URL() string {
	addrs := make([]string, 0, len(g.Sentinels))
	for _, s := range g.Sentinels {
		addrs = append(addrs, s.Addr())
	}
	u := "redis+sentinel://"
	if g.opts.Password != "" {
		u += ":" + url.PathEscape(g.opts.Password) + "@"
	}
	u += strings.Join(addrs, ",") + "/" + g.opts.MasterName
	if g.opts.SentinelPassword != "" {
		u += "?sentinel_password=" + url.QueryEscape(g.opts.SentinelPassword)
	}
	return u
}

func (g *SentinelGroup) sentinelMaster(ctx context.Context, s *Server) (map[string]string, error) {
	v, err := s.Do(ctx, "SENTINEL", "MASTER", g.opts.MasterName).Result()
	if err != nil {
		return nil, err
	}
	return fields(v), nil
}

// fields reads a Sentinel reply that lists an instance's fields, a flat
// array of names and values under RESP2 or a map under RESP3.
func fields(v any) map[string]string {
	m := map[string]string{}
	switch r := v.(type) {
	case []any:
		for i := 0; i+1 < len(r); i += 2 {
			m[fmt.Sprint(r[i])] = fmt.Sprint(r[i+1])
		}
	case map[any]any:
		for k, v := range r {
			m[fmt.Sprint(k)] = fmt.Sprint(v)
		}
	}
	return m
}

// Master returns the data node every running Sentinel names as primary,
// or nil while they disagree or none answers.
func (g *SentinelGroup) Master(ctx context.Context) *Server {
	var port string
	for _, s := range g.Sentinels {
		if !s.Running() {
			continue
		}
		addr, err := s.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.opts.MasterName).StringSlice()
		if err != nil || len(addr) != 2 {
			return nil
		}
		if port != "" && addr[1] != port {
			return nil
		}
		port = addr[1]
	}
	for _, d := range g.Data {
		if strconv.Itoa(d.Port()) == port {
			return d
		}
	}
	return nil
}

// Other returns the data node that is not s.
func (g *SentinelGroup) Other(s *Server) *Server {
	if g.Data[0] == s {
		return g.Data[1]
	}
	return g.Data[0]
}

// waitSynced waits until the primary has its replica online and in sync.
func (g *SentinelGroup) waitSynced(ctx context.Context) error {
	return waitFor(ctx, "replica in sync", func() bool {
		m := g.Master(ctx)
		if m == nil {
			m = g.Data[0]
		}
		r := g.Other(m)
		return m.Running() && r.Running() && m.Info(ctx, "replication", "role") == "master" &&
			m.Info(ctx, "replication", "connected_slaves") == "1" &&
			r.Info(ctx, "replication", "master_link_status") == "up"
	})
}

// Failover asks a Sentinel to fail the primary over (SENTINEL FAILOVER,
// which needs no agreement) and waits until every Sentinel names the
// former replica, which then answers as primary. It returns the new
// primary.
//
// Sentinel refuses the command (redis/redis src/sentinel.c, the "failover"
// branch of sentinelCommand) with -INPROG while its primary is flagged
// SRI_FAILOVER_IN_PROGRESS, and with -NOGOODSLAVE while its own view of
// the replica fails sentinelSelectSlave: the replica must not be flagged
// s_down, o_down or disconnected, must have answered a ping within
// 5 × sentinel_ping_period (5 s), had its INFO read within 3 ×
// sentinel_info_period (30 s) and report its link to the primary down no
// longer than 10 × down-after-milliseconds (10 s here, 50 s through the
// proxy), with a non-zero priority. On a busy machine both happen after a
// test hung the primary: the Sentinels may have started a failover of
// their own (the primary looked down for down-after-milliseconds), which
// keeps the flag until it ends or is aborted (an unelected Sentinel gives
// up after SENTINEL_ELECTION_TIMEOUT, 10 s), and a replica just thawed
// from SIGSTOP stays s_down until its next ping reply. So Failover waits until no
// Sentinel reports a failover in progress, all name one primary, and the
// asked Sentinel's SENTINEL REPLICAS reply passes sentinelSelectSlave's
// checks; it takes the primary they name then as the one to replace, and
// asks again while the answer is -INPROG or -NOGOODSLAVE: the view can
// change between the calls.
func (g *SentinelGroup) Failover(ctx context.Context) *Server {
	g.t.Helper()
	s := g.Sentinels[0]
	var old *Server
	var last string
	err := waitFor(ctx, "a Sentinel accepts SENTINEL FAILOVER", func() bool {
		if why := g.failoverInProgress(ctx); why != "" {
			last = why
			return false
		}
		if old = g.Master(ctx); old == nil {
			last = "the Sentinels do not name one primary"
			return false
		}
		if why := g.notPromotable(ctx, s); why != "" {
			last = why
			return false
		}
		err := s.Do(ctx, "SENTINEL", "FAILOVER", g.opts.MasterName).Err()
		if err != nil && (strings.HasPrefix(err.Error(), "NOGOODSLAVE") || strings.HasPrefix(err.Error(), "INPROG")) {
			last = err.Error()
			return false
		}
		if err != nil {
			g.t.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
		}
		return true
	})
	if err != nil {
		g.t.Fatalf("%v (last: %s)", err, last)
	}
	return g.waitNewMaster(ctx, old)
}

// failoverInProgress names a running Sentinel whose primary is flagged
// failover_in_progress in SENTINEL MASTER (addReplySentinelRedisInstance
// in sentinel.c), or says why one did not answer, or returns "".
func (g *SentinelGroup) failoverInProgress(ctx context.Context) string {
	for i, s := range g.Sentinels {
		if !s.Running() {
			continue
		}
		m, err := g.sentinelMaster(ctx, s)
		if err != nil {
			return fmt.Sprintf("Sentinel %d: %v", i, err)
		}
		if strings.Contains(m["flags"], "failover_in_progress") {
			return fmt.Sprintf("Sentinel %d has a failover in progress (flags %s)", i, m["flags"])
		}
	}
	return ""
}

// notPromotable says why Sentinel s would not promote any replica of the
// primary now, or "" when one passes sentinelSelectSlave's checks (see
// Failover), read from the fields of SENTINEL REPLICAS
// (addReplySentinelRedisInstance in sentinel.c).
func (g *SentinelGroup) notPromotable(ctx context.Context, s *Server) string {
	v, err := s.Do(ctx, "SENTINEL", "REPLICAS", g.opts.MasterName).Result()
	if err != nil {
		return err.Error()
	}
	replicas, _ := v.([]any)
	why := "no replica known"
	for _, r := range replicas {
		f := fields(r)
		ms := func(k string) int64 { n, _ := strconv.ParseInt(f[k], 10, 64); return n }
		switch {
		case strings.Contains(f["flags"], "down") || strings.Contains(f["flags"], "disconnected"):
			why = "replica flagged " + f["flags"]
		case ms("last-ok-ping-reply") > 5000:
			why = "replica's last ping reply " + f["last-ok-ping-reply"] + " ms ago"
		case ms("info-refresh") > 30000:
			why = "replica's INFO read " + f["info-refresh"] + " ms ago"
		case ms("master-link-down-time") > 10000:
			why = "replica's link to the primary down " + f["master-link-down-time"] + " ms"
		case f["slave-priority"] == "0":
			why = "replica priority 0"
		default:
			return ""
		}
	}
	return why
}

// KillMaster kills the primary's process and waits until the Sentinels
// agreed it is down and promoted the replica. It returns the new primary;
// the old one stays down until Rejoin.
func (g *SentinelGroup) KillMaster(ctx context.Context) *Server {
	g.t.Helper()
	old := g.Master(ctx)
	if old == nil {
		g.t.Fatal("redistest: no agreed primary before the kill")
	}
	old.Kill()
	if g.Proxy != nil {
		g.Proxy.Cut()
	}
	return g.waitNewMaster(ctx, old)
}

func (g *SentinelGroup) waitNewMaster(ctx context.Context, old *Server) *Server {
	g.t.Helper()
	next := g.Other(old)
	if err := waitFor(ctx, "Sentinels promote the replica", func() bool {
		return g.Master(ctx) == next && next.Info(ctx, "replication", "role") == "master"
	}); err != nil {
		g.t.Fatal(err)
	}
	return next
}

// Rejoin restarts a killed data node as a replica of the current primary
// and waits until it is in sync. It sends REPLICAOF itself, as an operator
// would: Sentinel converts a returning old primary too, but only after
// watching it for ten seconds or more.
func (g *SentinelGroup) Rejoin(ctx context.Context, s *Server) {
	g.t.Helper()
	m := g.Master(ctx)
	if m == nil || m == s {
		g.t.Fatal("redistest: no other primary to rejoin")
	}
	s.Restart()
	g.replicaOf(ctx, s, m)
	if err := g.waitSynced(ctx); err != nil {
		g.t.Fatal(err)
	}
}

// replicaOf makes s a replica of m. When Sentinel converts s at the same
// moment, it closes every client connection of s in the same transaction
// (sentinel.c, sentinelSendSlaveOf: MULTI, SLAVEOF, CONFIG REWRITE, CLIENT
// KILL TYPE normal, EXEC): on a busy machine this command once ended so,
// with io.EOF. It is then sent again until ctx ends, since REPLICAOF of the
// same primary twice does what once does; a reply from Redis is final.
func (g *SentinelGroup) replicaOf(ctx context.Context, s, m *Server) {
	g.t.Helper()
	for {
		err := s.Do(ctx, "REPLICAOF", "127.0.0.1", m.Port()).Err()
		if err == nil {
			return
		}
		if refused := redis.Error(nil); errors.As(err, &refused) || ctx.Err() != nil {
			g.t.Fatalf("redistest: REPLICAOF: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitSynced waits until the current primary has its replica in sync. A
// former primary that still thinks it is one is sent REPLICAOF right away:
// Sentinel does the same, but only when its next INFO poll (every 10 s)
// notices.
func (g *SentinelGroup) WaitSynced(ctx context.Context) {
	g.t.Helper()
	if m := g.Master(ctx); m != nil {
		if o := g.Other(m); o.Running() && o.Info(ctx, "replication", "role") == "master" {
			g.replicaOf(ctx, o, m)
		}
	}
	if err := g.waitSynced(ctx); err != nil {
		g.t.Fatal(err)
	}
}

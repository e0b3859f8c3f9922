package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
)

// storeCheckTimeout bounds one safety check of every primary.
const storeCheckTimeout = 5 * time.Second

// storeSafety checks, at start and every --store-check-interval, that the
// Redis store keeps what it is given (redisstore.SafetyChecker): an
// evicting maxmemory-policy refuses the start unless --allow-evicting-redis,
// a primary with neither persistence nor replica is a warning, and a
// dataset that vanished is an error line and a count.
type storeSafety struct {
	d       *Daemon
	checker *redisstore.SafetyChecker
	// said is the last thing logged per primary, so that a state is
	// logged when it begins, not at every check.
	said map[string]string
}

// checkStoreAtStart runs the first check. A Redis that does not answer yet
// is checked by the periodic checks once it does; refusing the start is
// then no longer possible, so an evicting policy found later is an error
// line and the store_node_evicting gauge.
func (d *Daemon) checkStoreAtStart(st *redisstore.Store) error {
	d.safety = &storeSafety{d: d, checker: st.NewSafetyChecker(), said: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), storeCheckTimeout)
	defer cancel()
	nodes, err := d.safety.checker.Check(ctx)
	if err != nil {
		d.log.Warn("redis safety not checked yet: the store does not answer; checked again every --store-check-interval",
			slog.String("error", err.Error()))
		return nil
	}
	if !d.cfg.AllowEvictingRedis {
		var evicting []string
		for _, n := range nodes {
			if n.Evicting() {
				role := ""
				if n.Replica {
					role = " (a replica: its policy applies once it is promoted)"
				}
				evicting = append(evicting, fmt.Sprintf("%s%s has maxmemory-policy %s", n.Addr, role, n.MaxmemoryPolicy))
			}
		}
		if len(evicting) > 0 {
			return fmt.Errorf("%w: redis maxmemory-policy: %s; every record has a TTL, so any policy but noeviction "+
				"may evict records and their retries would run again: set maxmemory-policy noeviction, "+
				"or start with --allow-evicting-redis", ErrConfig, strings.Join(evicting, "; "))
		}
	}
	d.safety.report(nodes)
	return nil
}

// watch checks again every --store-check-interval until ctx ends.
func (s *storeSafety) watch(ctx context.Context) {
	go every(ctx, s.d.cfg.StoreCheckInterval, func() bool {
		cctx, cancel := context.WithTimeout(ctx, storeCheckTimeout)
		nodes, err := s.checker.Check(cctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return false
		case err != nil:
			s.say("", slog.LevelWarn, "redis safety not checked: the store does not answer", slog.String("error", err.Error()))
		default:
			s.said[""] = ""
			s.report(nodes)
		}
		return true
	})
}

// report logs and exposes what a check found.
func (s *storeSafety) report(nodes []redisstore.NodeSafety) {
	gauges := make([]observe.StoreNode, 0, len(nodes))
	for _, n := range nodes {
		node := slog.String("node", n.Addr)
		if n.Err != nil {
			s.say(n.Addr, slog.LevelWarn, "redis node not checked", node, slog.String("error", n.Err.Error()))
			continue
		}
		g := observe.StoreNode{Addr: n.Addr, Evicting: n.Evicting(), Replicas: n.Replicas, Replica: n.Replica}
		switch n.Persistence {
		case redisstore.PersistenceAOF, redisstore.PersistenceRDB:
			g.Persistent = 1
		case redisstore.PersistenceUnknown:
			g.Persistent = -1
		}
		gauges = append(gauges, g)
		if n.DatasetLost {
			s.d.metrics.StoreDatasetLost()
			s.d.log.Error("redis dataset vanished: the marker record written beside the records is gone; "+
				"retries of the keys stored there will run again (a restart without persistence, a failover "+
				"to an empty replica, FLUSHALL or eviction)", node)
		}
		var msgs []string
		level := slog.LevelInfo
		if n.Evicting() {
			level = slog.LevelWarn
			if !s.d.cfg.AllowEvictingRedis {
				level = slog.LevelError
			}
			msgs = append(msgs, "maxmemory-policy "+n.MaxmemoryPolicy+" may evict records (set noeviction)")
		}
		if n.Volatile() {
			level = max(level, slog.LevelWarn)
			if n.Persistence == redisstore.PersistenceUnknown {
				msgs = append(msgs, "no replica, and persistence cannot be confirmed (no append-only file, CONFIG refused, no snapshot yet)")
			} else {
				msgs = append(msgs, "neither persistence nor a replica: a restart loses every record")
			}
		}
		what := "redis primary"
		if n.Replica {
			what = "redis replica"
		}
		if len(msgs) == 0 {
			if n.Replica {
				s.say(n.Addr, slog.LevelInfo, "redis replica has maxmemory-policy noeviction", node)
				continue
			}
			s.say(n.Addr, slog.LevelInfo, "redis primary keeps records: noeviction, and persistence or a replica", node,
				slog.String("persistence", string(n.Persistence)), slog.Int("replicas", n.Replicas))
			continue
		}
		s.say(n.Addr, level, what+" may lose records: "+strings.Join(msgs, "; "), node,
			slog.String("maxmemory_policy", n.MaxmemoryPolicy), slog.String("persistence", string(n.Persistence)),
			slog.Int("replicas", n.Replicas))
	}
	s.d.metrics.StoreChecked(gauges)
}

// say logs msg for a primary unless it was the last thing said of it.
func (s *storeSafety) say(addr string, level slog.Level, msg string, attrs ...slog.Attr) {
	if s.said[addr] == msg {
		return
	}
	s.said[addr] = msg
	s.d.log.LogAttrs(context.Background(), level, msg, attrs...)
}

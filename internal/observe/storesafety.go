package observe

import "github.com/prometheus/client_golang/prometheus"

// storeSafety holds what the store's safety checks found (daemon, package
// redisstore SafetyChecker): one series per primary, replaced at every
// check so that a primary gone after a failover leaves no stale series,
// and a count of datasets found vanished.
type storeSafety struct {
	evicting, persistent, replicas *prometheus.GaugeVec
	lost                           prometheus.Counter
}

func newStoreSafety(reg prometheus.Registerer) *storeSafety {
	s := &storeSafety{
		evicting: gaugeVec("store_node_evicting", []string{"node"},
			"1 when the Redis node's maxmemory-policy may evict records (anything but noeviction), else 0; primaries and their replicas."),
		persistent: gaugeVec("store_node_persistent", []string{"node"},
			"1 when the Redis primary persists (append-only file or RDB save points), 0 when it does not, -1 when it cannot be told (CONFIG refused, no snapshot seen)."),
		replicas: gaugeVec("store_node_replicas", []string{"node"},
			"Replicas connected to the Redis primary (INFO connected_slaves)."),
		lost: counter("store_dataset_lost_total",
			"Times a Redis shard's marker record was found gone or replaced: the records stored with it vanished, so their retries run again."),
	}
	reg.MustRegister(s.evicting, s.persistent, s.replicas, s.lost)
	return s
}

// StoreNode is what one primary of the store said at a safety check.
type StoreNode struct {
	Addr     string
	Evicting bool
	// Persistent is 1, 0, or -1 when unknown.
	Persistent int
	Replicas   int
	// Replica: a replica, whose maxmemory-policy alone is read; only its
	// evicting gauge is set.
	Replica bool
}

// StoreChecked replaces the per-primary gauges with what a check found.
func (m *Metrics) StoreChecked(nodes []StoreNode) {
	s := m.safety
	s.evicting.Reset()
	s.persistent.Reset()
	s.replicas.Reset()
	for _, n := range nodes {
		ev := 0.0
		if n.Evicting {
			ev = 1
		}
		s.evicting.WithLabelValues(n.Addr).Set(ev)
		if n.Replica {
			continue
		}
		s.persistent.WithLabelValues(n.Addr).Set(float64(n.Persistent))
		s.replicas.WithLabelValues(n.Addr).Set(float64(n.Replicas))
	}
}

// StoreDatasetLost counts a shard whose data was found vanished.
func (m *Metrics) StoreDatasetLost() { m.safety.lost.Inc() }

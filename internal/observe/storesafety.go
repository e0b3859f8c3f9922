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
		evicting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "store_node_evicting",
			Help: "1 when the Redis node's maxmemory-policy may evict records (anything but noeviction), else 0; primaries and their replicas.",
		}, []string{"node"}),
		persistent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "store_node_persistent",
			Help: "1 when the Redis primary persists (append-only file or RDB save points), 0 when it does not, -1 when it cannot be told (CONFIG refused, no snapshot seen).",
		}, []string{"node"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "store_node_replicas",
			Help: "Replicas connected to the Redis primary (INFO connected_slaves).",
		}, []string{"node"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "store_dataset_lost_total",
			Help: "Times a Redis shard's marker record was found gone or replaced: the records stored with it vanished, so their retries run again.",
		}),
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

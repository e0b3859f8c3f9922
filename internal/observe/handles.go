package observe

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// maxCachedSeries bounds the handles one family keeps; past it, label
// values are looked up in the vector on every call, as without the cache.
// The request path's families have a handful of series per policy.
const maxCachedSeries = 1024

// labelPair is one series' label values (the second empty for a family with
// one label).
type labelPair struct{ a, b string }

// seriesCache keeps the series of a vector the request path updates by
// their label values, so a request finds its counter or histogram in a map
// that is only read (no lock, no label hashing and validation, no variadic
// slice) instead of through client_golang's WithLabelValues
// (MetricVec.GetMetricWithLabelValues: validateLabelValues, hashLabelValues,
// then metricMap's RWMutex), which was about 1.6 % of the server's CPU under
// load. A series is created by the vector's own WithLabelValues the first
// time its label values are seen, exactly as before, so the exposition is
// unchanged. No vector cached here is ever Reset or has a series deleted
// (which would leave a cached handle pointing to a series no longer
// collected).
type seriesCache[M any] struct {
	mu     sync.Mutex                      // serializes additions
	series atomic.Pointer[map[labelPair]M] // replaced, never changed
	get    func(labelPair) M
}

func newSeriesCache[M any](get func(labelPair) M) *seriesCache[M] {
	c := &seriesCache[M]{get: get}
	empty := map[labelPair]M{}
	c.series.Store(&empty)
	return c
}

func (c *seriesCache[M]) of(a, b string) M {
	k := labelPair{a, b}
	if m, ok := (*c.series.Load())[k]; ok {
		return m
	}
	return c.add(k)
}

// add creates (or finds) the series of k in the vector and publishes a
// copy of the map with it.
func (c *seriesCache[M]) add(k labelPair) M {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.series.Load()
	if m, ok := old[k]; ok {
		return m
	}
	m := c.get(k)
	if len(old) >= maxCachedSeries {
		return m
	}
	next := make(map[labelPair]M, len(old)+1)
	for kk, v := range old {
		next[kk] = v
	}
	next[k] = m
	c.series.Store(&next)
	return m
}

func counters2(v *prometheus.CounterVec) *seriesCache[prometheus.Counter] {
	return newSeriesCache(func(k labelPair) prometheus.Counter { return v.WithLabelValues(k.a, k.b) })
}

func observers1(v *prometheus.HistogramVec) *seriesCache[prometheus.Observer] {
	return newSeriesCache(func(k labelPair) prometheus.Observer { return v.WithLabelValues(k.a) })
}

func observers2(v *prometheus.HistogramVec) *seriesCache[prometheus.Observer] {
	return newSeriesCache(func(k labelPair) prometheus.Observer { return v.WithLabelValues(k.a, k.b) })
}

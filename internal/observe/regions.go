package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Regions counts what crossing regions does (package region): the store
// calls each home region answers, hand-overs, moved answers, quarantined
// keys, and the measured round trip to each region's store.
type Regions struct {
	calls       *prometheus.HistogramVec
	handovers   *prometheus.CounterVec
	moved       *prometheus.CounterVec
	quarantined *prometheus.CounterVec
	outOfReach  *prometheus.CounterVec
	scripts     *prometheus.CounterVec
	rtt         *prometheus.GaugeVec
	epoch       prometheus.Gauge
	// callSeries are calls' series of each region named at start, by
	// operation and result (seriesCache): a store call of the request path
	// finds its histogram without WithLabelValues. Only read once built.
	callSeries map[string]*seriesCache[prometheus.Observer]
}

// Regions registers the region metrics on m's registry, with the series
// the alert rules read at 0 for each region named, the first time it is
// called (the daemon calls it when the server knows its region); later
// calls return the same metrics.
func (m *Metrics) Regions(names []string) *Regions {
	m.regionsOnce.Do(func() { m.regions = newRegions(m, names) })
	return m.regions
}

func newRegions(m *Metrics, names []string) *Regions {
	r := &Regions{
		calls: histogramVec("region_store_call_duration_seconds", []string{"region", "op", "result"}, []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .15, .2, .3, .5, 1, 2},
			"Store calls made for keys homed by a homes map, by the home region that answered, operation and result (ok, not_found, not_holder, timeout, error, refused)."),
		handovers: counterVec("region_handovers_total", []string{"from", "outcome"},
			"Keys of a moved scope asked of their former home (from) first, by what it answered: handed_over (a tombstone now sends the key on), in_flight, completed, unknown, mismatch (the former home holds the record), moved (maps disagree) or error."),
		moved: counterVec("region_moved_total", []string{"home"},
			"Reservations a store answered with a tombstone newer than this server's homes map, followed to the region it names (home)."),
		quarantined: counterVec("region_quarantined_total", []string{"lost"},
			"Keys answered outcome-unknown because the region declared lost that may have seen them could not be asked."),
		outOfReach: counterVec("region_out_of_reach_total", []string{"home"},
			"Keys refused (idempotency-home-out-of-reach) before anything was reserved: the calls to their home's store cannot fit in the time Envoy grants one message (--envoy-max-message-timeout)."),
		scripts: counterVec("region_script_loads_total", []string{"region", "result"},
			"Loads of the store's scripts into another region's Redis, at start and then each --region-ping-interval until one succeeds, by result (ok, error)."),
		rtt: gaugeVec("region_store_rtt_seconds", []string{"region"},
			"Round trip of a PING to each region's store on a warm connection, measured every few seconds."),
		epoch: gauge("homes_epoch",
			"Epoch of the homes map the server holds (0: none)."),
	}
	r.callSeries = make(map[string]*seriesCache[prometheus.Observer], len(names))
	for _, n := range names {
		r.callSeries[n] = newSeriesCache(func(k labelPair) prometheus.Observer { return r.calls.WithLabelValues(n, k.a, k.b) })
		for _, op := range []string{"reserve", "complete"} {
			r.calls.WithLabelValues(n, op, "error")
			r.calls.WithLabelValues(n, op, "timeout")
		}
		r.quarantined.WithLabelValues(n)
		r.moved.WithLabelValues(n)
		r.outOfReach.WithLabelValues(n)
		r.handovers.WithLabelValues(n, "error")
		r.handovers.WithLabelValues(n, "moved")
	}
	m.reg.MustRegister(r.calls, r.handovers, r.moved, r.quarantined, r.outOfReach, r.scripts, r.rtt, r.epoch)
	return r
}

// StoreCall times one call to region's store.
func (r *Regions) StoreCall(region, op string, err error, d time.Duration) {
	if c, ok := r.callSeries[region]; ok {
		c.of(op, result(err)).Observe(d.Seconds())
		return
	}
	r.calls.WithLabelValues(region, op, result(err)).Observe(d.Seconds())
}

// HandedOver implements region.Observer.
func (r *Regions) HandedOver(from, outcome string) { r.handovers.WithLabelValues(from, outcome).Inc() }

// Moved implements region.Observer.
func (r *Regions) Moved(home string) { r.moved.WithLabelValues(home).Inc() }

// Quarantined implements region.Observer.
func (r *Regions) Quarantined(lost string) { r.quarantined.WithLabelValues(lost).Inc() }

// RoundTrip records region's measured round trip.
func (r *Regions) RoundTrip(region string, d time.Duration) {
	r.rtt.WithLabelValues(region).Set(d.Seconds())
}

// OutOfReach implements region.Observer.
func (r *Regions) OutOfReach(home string) { r.outOfReach.WithLabelValues(home).Inc() }

// ScriptsLoaded counts one load of the scripts into region's Redis.
func (r *Regions) ScriptsLoaded(region string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	r.scripts.WithLabelValues(region, result).Inc()
}

// Epoch records the homes map's epoch.
func (r *Regions) Epoch(n int) { r.epoch.Set(float64(n)) }

// Package observe makes idem-extproc observable: Prometheus metrics for
// every decision and store call, an instrumented store that also traces
// each call, and the OpenTelemetry tracer provider configured from the
// standard OTEL_* environment variables.
package observe

import (
	"net/http"
	"sync"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/envoyorigin"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-extproc/idem-extproc/internal/version"
)

// Namespace prefixes every metric name.
const Namespace = "idem_extproc"

// Metrics holds the server's Prometheus metrics in a registry of its own
// (no global state: tests build as many as they like).
type Metrics struct {
	reg            *prometheus.Registry
	decisions      *prometheus.CounterVec
	storeCalls     *prometheus.HistogramVec
	openStreams    prometheus.Gauge
	replayAge      *prometheus.HistogramVec
	settleFailures *prometheus.CounterVec
	reloads        *prometheus.CounterVec
	adminActions   *prometheus.CounterVec
	requests       *prometheus.CounterVec
	shadow         *prometheus.CounterVec
	keyWarnings    *prometheus.CounterVec
	safety         *storeSafety
	missingAttrs   *prometheus.CounterVec
	droppedHeaders *prometheus.CounterVec
	cancels        *prometheus.CounterVec
	storeFailures  *prometheus.CounterVec
	started        time.Time
	// regions are the region metrics, registered by the first Regions.
	regionsOnce sync.Once
	regions     *Regions

	// The series the request path updates, by label values (seriesCache).
	decisionSeries *seriesCache[prometheus.Counter]
	requestSeries  *seriesCache[prometheus.Counter]
	storeSeries    *seriesCache[prometheus.Observer]
	replaySeries   *seriesCache[prometheus.Observer]
	shadowSeries   *seriesCache[prometheus.Counter]
}

var _ idem.Observer = (*Metrics)(nil)

// NewMetrics registers the metrics, the Go runtime and process collectors
// and build information.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg:     prometheus.NewRegistry(),
		started: time.Now(),
		decisions: counterVec("decisions_total", []string{"policy", "decision"},
			"Decisions by policy and outcome: bypassed, rejected, reserved, replayed, conflict, mismatch, unknown, "+
				"store_unavailable, record_unusable, fail_open at the request; stored, released, marked_unknown at the response."),
		storeCalls: histogramVec("store_call_duration_seconds", []string{"op", "result"}, []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
			"Duration of store calls by operation and result (ok, not_found, not_holder, not_unknown, timeout, error)."),
		openStreams: gauge("open_streams",
			"ext_proc streams (HTTP requests) in progress."),
		replayAge: histogramVec("replay_record_age_seconds", []string{"policy"}, []float64{.1, 1, 10, 60, 600, 3600, 6 * 3600, 24 * 3600, 7 * 24 * 3600},
			"Age of the record a replay was served from."),
		settleFailures: counterVec("settle_failures_total", []string{"policy", "decision"},
			"Responses or stream ends that could not be recorded even after a retry; their records turn unknown when the lease ends."),
		reloads: counterVec("config_reloads_total", []string{"result"},
			"Configuration reloads by result (ok, rejected)."),
		adminActions: counterVec("admin_actions_total", []string{"action", "result"},
			"Admin API actions by action and result."),
		requests: counterVec("requests_total", []string{"policy", "key"},
			"Requests a policy matched, whatever its enforcement, by whether they carried a key (present, absent): key adoption."),
		shadow: counterVec("shadow_decisions_total", []string{"policy", "decision"},
			"What shadow policies would have done: would_reserve, would_replay, would_conflict, would_mismatch, would_unknown, "+
				"would_reject, or store_error when the store could not be asked."),
		keyWarnings: counterVec("key_warnings_total", []string{"policy"},
			"Requests without a required key let through with a Warning during the policy's grace period (key.warn_until)."),
		missingAttrs: counterVec("missing_attribute_total", []string{"policy", "attribute"},
			"Requests whose policy needed an Envoy attribute the ext_proc filter did not send (response.code_details: "+
				"add it to response_attributes; a principal or xds.route_name: request_attributes)."),
	}
	m.droppedHeaders = counterVec("replay_headers_dropped_total", []string{"policy"},
		"Stored headers left out of replays because Envoy would refuse the whole header mutation (a control character, "+
			"more than 100 headers or 60 KiB).")
	m.cancels = counterVec("reservation_cancels_total", []string{"policy", "result"},
		"Reservations whose call ran past the store budget (the request was refused), undone by their server: released "+
			"(it had reached the store), not_held (it had not; refused should it arrive), failed or dropped (not undone: if it "+
			"reached the store, the key answers request-in-progress, then outcome-unknown).")
	m.storeFailures = newStoreFailures()
	m.decisionSeries = counters2(m.decisions)
	m.requestSeries = counters2(m.requests)
	m.storeSeries = observers2(m.storeCalls)
	m.replaySeries = observers1(m.replayAge)
	m.shadowSeries = counters2(m.shadow)
	build := newBuildInfo()
	m.safety = newStoreSafety(m.reg)
	m.precreate()
	m.reg.MustRegister(m.decisions, m.storeCalls, m.openStreams, m.replayAge, m.settleFailures, m.reloads, m.adminActions,
		m.requests, m.shadow, m.keyWarnings, m.missingAttrs, m.droppedHeaders, m.cancels, m.storeFailures, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// newStoreFailures is the store_failures_total counter, with a series of
// each kind from the start, so that an alert sees its first increase.
func newStoreFailures() *prometheus.CounterVec {
	c := counterVec("store_failures_total", []string{"kind"},
		"Store calls that failed for a reason of the server's own making, also counted as result error: "+
			"reply_refused (a reply past the reply bounds; its connection was dropped), panic (the call panicked; logged with its stack).")
	for _, k := range []string{"reply_refused", "panic"} {
		c.WithLabelValues(k)
	}
	return c
}

// newBuildInfo is the build_info gauge, set.
func newBuildInfo() *prometheus.GaugeVec {
	build := gaugeVec("build_info", []string{"version", "revision", "goversion"},
		"Build information; the value is always 1.")
	bi := version.Get()
	build.WithLabelValues(bi.Version, bi.Revision, bi.GoVersion).Set(1)
	return build
}

// precreate makes the series alert rules read exist from the start, so a
// rule on a family sees it before its first event (see KnowPolicies).
func (m *Metrics) precreate() {
	m.droppedHeaders.WithLabelValues("none")
	// Every attribute's series exists from the start (policy "none").
	for name := range envoyorigin.MissingAttributes {
		m.missingAttrs.WithLabelValues("none", name)
	}
	for _, r := range []string{"ok", "rejected"} {
		m.reloads.WithLabelValues(r)
	}
	for _, op := range requestPathOps {
		for _, r := range []string{"error", "timeout"} {
			m.storeCalls.WithLabelValues(op, r)
		}
	}
	m.storeCalls.WithLabelValues("reserve", "ok")
}

// Registry returns the registry, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

func policyLabel(p string) string {
	if p == "" {
		return "none"
	}
	return p
}

// StreamStarted implements idem.Observer.
func (m *Metrics) StreamStarted() { m.openStreams.Inc() }

// StreamEnded implements idem.Observer.
func (m *Metrics) StreamEnded() { m.openStreams.Dec() }

// Decided implements idem.Observer.
func (m *Metrics) Decided(policy string, d idem.Decision) {
	m.decisionSeries.of(policyLabel(policy), string(d)).Inc()
}

// Replayed implements idem.Observer.
func (m *Metrics) Replayed(policy string, age time.Duration) {
	m.replaySeries.of(policyLabel(policy), "").Observe(age.Seconds())
}

// SettleFailed implements idem.Observer.
func (m *Metrics) SettleFailed(policy, decision string) {
	m.settleFailures.WithLabelValues(policyLabel(policy), decision).Inc()
}

// Requested implements idem.Observer.
func (m *Metrics) Requested(policy string, withKey bool) {
	key := "absent"
	if withKey {
		key = "present"
	}
	m.requestSeries.of(policyLabel(policy), key).Inc()
}

// ShadowDecided implements idem.Observer.
func (m *Metrics) ShadowDecided(policy string, d idem.ShadowDecision) {
	m.shadowSeries.of(policyLabel(policy), string(d)).Inc()
}

// KeyWarned implements idem.Observer.
func (m *Metrics) KeyWarned(policy string) {
	m.keyWarnings.WithLabelValues(policyLabel(policy)).Inc()
}

// MissingAttribute counts a request whose policy needed an attribute Envoy
// did not send.
func (m *Metrics) MissingAttribute(policy, attribute string) {
	m.missingAttrs.WithLabelValues(policyLabel(policy), attribute).Inc()
}

// ReplayHeadersDropped counts stored headers left out of a replay.
func (m *Metrics) ReplayHeadersDropped(policy string, n int) {
	m.droppedHeaders.WithLabelValues(policyLabel(policy)).Add(float64(n))
}

// ReservationCancelled implements idem.Observer.
func (m *Metrics) ReservationCancelled(policy string, o idem.CancelOutcome) {
	m.cancels.WithLabelValues(policyLabel(policy), string(o)).Inc()
}

// ObserveStoreCall times one store call.
func (m *Metrics) ObserveStoreCall(op, result string, d time.Duration) {
	m.storeSeries.of(op, result).Observe(d.Seconds())
}

// requestPathOps are the store calls a request makes (InstrumentStore's
// names); their error and timeout series exist from the start.
var requestPathOps = []string{"reserve", "renew", "complete", "release", "mark_unknown", "get"}

// alertedDecisions and alertedSettles are the label values per policy that
// observability/prometheus-rules.yaml reads.
var (
	alertedDecisions = []idem.Decision{idem.DecisionReserved, idem.DecisionReplayed,
		idem.DecisionFailOpen, idem.DecisionMarkedUnknown, idem.DecisionRecordUnusable}
	alertedSettles = []idem.Decision{idem.DecisionStored, idem.DecisionReleased, idem.DecisionMarkedUnknown}
)

// KnowPolicies starts at zero, for each policy named, the series that the
// alert rules read. A counter series that first appears already at 1 shows
// no increase: rate() and increase() need two samples in their range
// (prometheus/prometheus promql/functions.go, extrapolatedRate), so
// without this a policy's first fail_open or settle failure would never
// fire its alert. The daemon calls it at start and after each reload;
// series of policies since removed stay, as counters do.
func (m *Metrics) KnowPolicies(names []string) {
	for _, n := range names {
		for _, d := range alertedDecisions {
			m.decisions.WithLabelValues(policyLabel(n), string(d))
		}
		for _, d := range alertedSettles {
			m.settleFailures.WithLabelValues(policyLabel(n), string(d))
		}
	}
}

// ConfigReloaded counts a reload of the configuration file.
func (m *Metrics) ConfigReloaded(err error) {
	result := "ok"
	if err != nil {
		result = "rejected"
	}
	m.reloads.WithLabelValues(result).Inc()
}

// AdminAction counts an admin API action.
func (m *Metrics) AdminAction(action, result string) {
	m.adminActions.WithLabelValues(action, result).Inc()
}

// counterVec, counter, gaugeVec, gauge and histogramVec make a metric of
// this server's Namespace.
func counterVec(name string, labels []string, help string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
}

func gaugeVec(name string, labels []string, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
}

func histogramVec(name string, labels []string, buckets []float64, help string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}, labels)
}

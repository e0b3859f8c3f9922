package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// PolicyCounts are one policy's counters since the server started. They are
// read from the Prometheus counters themselves, so the admin API's summary
// and /metrics never disagree.
type PolicyCounts struct {
	// WithKey and WithoutKey count the requests the policy matched
	// (requests_total).
	WithKey, WithoutKey float64
	// KeyWarnings counts requests let through without a required key
	// during the grace period (key_warnings_total).
	KeyWarnings float64
	// Decisions counts decisions_total by decision, Shadow
	// shadow_decisions_total by shadow decision.
	Decisions map[string]float64
	Shadow    map[string]float64
}

// Since returns when the counters started: the process's start, give or
// take.
func (m *Metrics) Since() time.Time { return m.started }

// Counts returns the counters of every policy that has any, by name.
func (m *Metrics) Counts() map[string]*PolicyCounts {
	out := map[string]*PolicyCounts{}
	of := func(policy string) *PolicyCounts {
		c, ok := out[policy]
		if !ok {
			c = &PolicyCounts{Decisions: map[string]float64{}, Shadow: map[string]float64{}}
			out[policy] = c
		}
		return c
	}
	collect(m.requests, func(l map[string]string, v float64) {
		if l["key"] == "present" {
			of(l["policy"]).WithKey += v
		} else {
			of(l["policy"]).WithoutKey += v
		}
	})
	collect(m.keyWarnings, func(l map[string]string, v float64) { of(l["policy"]).KeyWarnings += v })
	collect(m.decisions, func(l map[string]string, v float64) { of(l["policy"]).Decisions[l["decision"]] += v })
	collect(m.shadow, func(l map[string]string, v float64) { of(l["policy"]).Shadow[l["decision"]] += v })
	return out
}

// collect reads every sample of a counter vector.
func collect(c prometheus.Collector, f func(labels map[string]string, value float64)) {
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	for pm := range ch {
		var d dto.Metric
		if err := pm.Write(&d); err != nil {
			continue
		}
		labels := make(map[string]string, len(d.GetLabel()))
		for _, lp := range d.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		f(labels, d.GetCounter().GetValue())
	}
}

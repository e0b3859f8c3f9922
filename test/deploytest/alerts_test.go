package deploytest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"sigs.k8s.io/yaml"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
)

// The alert rules are evaluated here, in the deploy tests' own module,
// because Prometheus's query engine brings Kubernetes' libraries with it,
// which the server's module should not list.

// alertRule is one rule of observability/prometheus-rules.yaml.
type alertRule struct {
	Alert string `json:"alert"`
	Expr  string `json:"expr"`
	For   string `json:"for"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile("../../observability/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range doc.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// scrapeInterval is the interval of the scrape sequence.
const scrapeInterval = 15 * time.Second

// firstEvents says, per alert, what happens on the server from the second
// scrape on: the first occurrence of what the alert is about. Single
// events (one fail_open, one settle failure, one rejected reload) happen
// once; rates are kept up.
var firstEvents = map[string]func(m *observe.Metrics, step int){
	"IdemStoreErrors": func(m *observe.Metrics, _ int) {
		for range 30 { // 2/s
			m.ObserveStoreCall("reserve", "error", time.Millisecond)
		}
	},
	"IdemStoreSlow": func(m *observe.Metrics, _ int) {
		for range 100 {
			m.ObserveStoreCall("reserve", "ok", 80*time.Millisecond)
		}
	},
	"IdemRequestsPassUnprotected": func(m *observe.Metrics, step int) {
		if step == 1 {
			m.Decided("orders", idem.DecisionFailOpen)
		}
	},
	"IdemStoredRecordsUnusable": func(m *observe.Metrics, step int) {
		if step == 1 {
			m.Decided("orders", idem.DecisionRecordUnusable)
		}
	},
	"IdemUnknownOutcomesRising": func(m *observe.Metrics, _ int) {
		for i := range 100 {
			m.Decided("orders", idem.DecisionReserved)
			if i < 5 {
				m.Decided("orders", idem.DecisionMarkedUnknown)
			}
		}
	},
	"IdemSettleFailures": func(m *observe.Metrics, step int) {
		if step == 1 {
			m.SettleFailed("orders", string(idem.DecisionStored))
		}
	},
	"IdemReplayRateJump": func(m *observe.Metrics, _ int) {
		for range 300 { // 20/s on a server too young to have a baseline
			m.Decided("orders", idem.DecisionReplayed)
		}
	},
	"IdemStoreDatasetLost": func(m *observe.Metrics, step int) {
		if step == 1 {
			m.StoreDatasetLost()
		}
	},
	"IdemRegionStoreErrors": func(m *observe.Metrics, _ int) {
		for range 30 { // 2/s
			m.Regions(nil).StoreCall("us", "reserve", context.DeadlineExceeded, 400*time.Millisecond)
		}
	},
	"IdemRegionMapsDisagree": func(m *observe.Metrics, step int) {
		if step == 1 {
			m.Regions(nil).HandedOver("us", "moved")
		}
	},
	"IdemRegionKeysQuarantined": func(m *observe.Metrics, step int) {
		if step == 1 {
			m.Regions(nil).Quarantined("us")
		}
	},
	"IdemConfigReloadRejected": func(m *observe.Metrics, step int) {
		if step == 1 {
			m.ConfigReloaded(errors.New("p.yaml: the file is empty"))
		}
	},
}

// TestAlertsFireOnTheFirstEvent evaluates every rule of the alert file with
// Prometheus's own query engine (and its rule manager's `for`) over a sequence of scrapes of a fresh server's registry: a
// quiet one first, then the first event. Each alert must fire within its
// `for` plus a few scrapes; on a server where nothing happens none fires.
func TestAlertsFireOnTheFirstEvent(t *testing.T) {
	rs := alertRules(t)
	if len(rs) == 0 {
		t.Fatal("no rules")
	}
	seen := map[string]bool{}
	for _, r := range rs {
		seen[r.Alert] = true
		event, ok := firstEvents[r.Alert]
		if !ok {
			t.Errorf("alert %s has no first-event scenario here", r.Alert)
			continue
		}
		t.Run(r.Alert, func(t *testing.T) {
			hold := time.Duration(0)
			if r.For != "" {
				var err error
				if hold, err = time.ParseDuration(r.For); err != nil {
					t.Fatal(err)
				}
			}
			steps := int((hold+5*time.Minute)/scrapeInterval) + 1
			if at := firesAt(t, r, hold, steps, event); at < 0 {
				t.Fatalf("did not fire within %s of the first event", time.Duration(steps-1)*scrapeInterval)
			} else {
				t.Logf("fires %s after the first event (for: %s)", time.Duration(at-1)*scrapeInterval, hold)
			}
			if at := firesAt(t, r, hold, steps, func(*observe.Metrics, int) {}); at >= 0 {
				t.Fatalf("fires on a quiet server, at scrape %d", at)
			}
		})
	}
	for name := range firstEvents {
		if !seen[name] {
			t.Errorf("scenario for %s, which the rules no longer have", name)
		}
	}
}

// firesAt runs the scrape sequence on a fresh Metrics (with the policy
// "orders" known, as the daemon does at start) and returns the first
// scrape at which the alert fires, or -1. The rule's expression is
// evaluated at each scrape by Prometheus's engine; `for` is applied as
// Prometheus's rule manager does (prometheus/prometheus rules/alerting.go,
// AlertingRule.Eval): a label set the expression returns becomes pending,
// fires once it has been returned for hold, and is dropped when a pending
// label set is not returned.
func firesAt(t *testing.T, r alertRule, hold time.Duration, steps int, event func(*observe.Metrics, int)) int {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	st := &memStorage{}
	engine := promql.NewEngine(promql.EngineOpts{Logger: quiet, MaxSamples: 1e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	m := observe.NewMetrics()
	m.KnowPolicies([]string{"orders"})
	m.Regions([]string{"eu", "us"}) // as a daemon with --region eu --region-redis us=…
	active := map[uint64]time.Time{}
	start := time.Unix(1_800_000_000, 0)
	for step := range steps {
		if step > 0 {
			event(m, step)
		}
		ts := start.Add(time.Duration(step) * scrapeInterval)
		appendScrape(t, st, m, ts)
		q, err := engine.NewInstantQuery(context.Background(), st, nil, r.Expr, ts)
		if err != nil {
			t.Fatalf("%s: %v", r.Alert, err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("%s: %v", r.Alert, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			t.Fatalf("%s: %v", r.Alert, err)
		}
		q.Close()
		returned := map[uint64]bool{}
		for _, smpl := range vec {
			h := smpl.Metric.Hash()
			returned[h] = true
			if _, ok := active[h]; !ok {
				active[h] = ts
			}
		}
		for h, since := range active {
			if !returned[h] {
				delete(active, h)
			} else if ts.Sub(since) >= hold {
				return step
			}
		}
	}
	return -1
}

// appendScrape stores one scrape of m's registry at ts, as Prometheus
// stores the text exposition: counters and gauges as they are, histograms
// as _bucket{le}, _sum and _count series.
func appendScrape(t *testing.T, st *memStorage, m *observe.Metrics, ts time.Time) {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	ms := ts.UnixMilli()
	add := func(name string, pairs []*dto.LabelPair, v float64, extra ...string) {
		b := labels.NewBuilder(labels.EmptyLabels())
		b.Set(model.MetricNameLabel, name)
		for _, p := range pairs {
			b.Set(p.GetName(), p.GetValue())
		}
		for i := 0; i+1 < len(extra); i += 2 {
			b.Set(extra[i], extra[i+1])
		}
		st.append(b.Labels(), ms, v)
	}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(f.GetName(), mt.GetLabel(), mt.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(f.GetName(), mt.GetLabel(), mt.GetGauge().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := mt.GetHistogram()
				for _, b := range h.GetBucket() {
					add(f.GetName()+"_bucket", mt.GetLabel(), float64(b.GetCumulativeCount()), "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
				}
				add(f.GetName()+"_bucket", mt.GetLabel(), float64(h.GetSampleCount()), "le", "+Inf")
				add(f.GetName()+"_sum", mt.GetLabel(), h.GetSampleSum())
				add(f.GetName()+"_count", mt.GetLabel(), float64(h.GetSampleCount()))
			case dto.MetricType_UNTYPED:
				add(f.GetName(), mt.GetLabel(), mt.GetUntyped().GetValue())
			default:
				// Summaries: none among the metrics alerts read.
			}
		}
	}
}

// memStorage is the scraped samples, queryable by the engine. (Prometheus's
// teststorage is a whole TSDB whose imports bring in every cloud SDK;
// float samples in memory are all these rules need.)
type memStorage struct {
	lsets  []labels.Labels
	points [][]chunks.Sample
}

func (s *memStorage) append(l labels.Labels, t int64, v float64) {
	for i, have := range s.lsets {
		if labels.Equal(have, l) {
			s.points[i] = append(s.points[i], floatSample{t, v})
			return
		}
	}
	s.lsets = append(s.lsets, l)
	s.points = append(s.points, []chunks.Sample{floatSample{t, v}})
}

func (s *memStorage) Querier(int64, int64) (storage.Querier, error) {
	return &storage.MockQuerier{SelectMockFunction: s.sel}, nil
}

func (s *memStorage) sel(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
	for i, l := range s.lsets {
		if !slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return !m.Matches(l.Get(m.Name)) }) {
			out = append(out, storage.NewListSeries(l, slices.Clone(s.points[i])))
		}
	}
	slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
	return &seriesList{list: out, i: -1}
}

type seriesList struct {
	list []storage.Series
	i    int
}

func (l *seriesList) Next() bool                      { l.i++; return l.i < len(l.list) }
func (l *seriesList) At() storage.Series              { return l.list[l.i] }
func (*seriesList) Err() error                        { return nil }
func (*seriesList) Warnings() annotations.Annotations { return nil }

type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                    { return s.t }
func (floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                  { return s.f }
func (floatSample) H() *histogram.Histogram       { return nil }
func (floatSample) FH() *histogram.FloatHistogram { return nil }
func (floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample         { return s }

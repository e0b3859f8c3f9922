package observe_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
)

// exercised returns a Metrics in which every metric has a sample, and the
// names the registry exposes (with histogram suffixes).
func exercised(t *testing.T) (*observe.Metrics, []string) {
	m := observe.NewMetrics()
	m.StreamStarted()
	m.Decided("p", idem.DecisionReserved)
	m.Replayed("p", time.Second)
	m.SettleFailed("p", "stored")
	m.ConfigReloaded(nil)
	m.AdminAction("purge", "ok")
	m.ObserveStoreCall("reserve", "ok", time.Millisecond)
	m.Requested("p", true)
	m.ShadowDecided("p", idem.ShadowWouldReplay)
	m.KeyWarned("p")
	r := m.Regions([]string{"eu"})
	r.StoreCall("eu", "reserve", nil, time.Millisecond)
	r.HandedOver("eu", "handed_over")
	r.Moved("eu")
	r.Quarantined("eu")
	r.RoundTrip("eu", time.Millisecond)
	r.Epoch(1)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fams {
		n := f.GetName()
		names = append(names, n)
		if f.GetType().String() == "HISTOGRAM" {
			names = append(names, n+"_bucket", n+"_sum", n+"_count")
		}
	}
	return m, names
}

// TestAlertRulesNameRealMetrics keeps observability/prometheus-rules.yaml
// in step with the metrics the server exposes.
func TestAlertRulesNameRealMetrics(t *testing.T) {
	_, names := exercised(t)
	b, err := os.ReadFile("../../observability/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &doc); err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`idem_extproc_[a-z_]+`)
	n := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			for _, name := range metric.FindAllString(r.Expr, -1) {
				n++
				if !slices.Contains(names, name) {
					t.Errorf("alert %s uses %s, which the server does not expose", r.Alert, name)
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no metric found in the rules")
	}
}

// TestMetricsAreDocumented: every metric the server exposes has a row in
// docs/observability.md.
func TestMetricsAreDocumented(t *testing.T) {
	_, names := exercised(t)
	doc, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, observe.Namespace+"_") && !strings.HasSuffix(n, "_bucket") && !strings.HasSuffix(n, "_sum") &&
			!strings.HasSuffix(n, "_count") && !strings.Contains(string(doc), "`"+n+"`") {
			t.Errorf("%s is not documented in docs/observability.md", n)
		}
	}
}

// TestDocumentedMetricsExist is TestMetricsAreDocumented's other half:
// every metric name the documentation gives (docs/*.md, README.md) is one
// the server exposes, so a renamed or removed metric is not left behind in
// a page a reader builds a dashboard or an alert from.
func TestDocumentedMetricsExist(t *testing.T) {
	_, names := exercised(t)
	// Metrics that exercised does not reach (a store's node gauges, vectors
	// with no sample yet) are read from their declarations.
	sources, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	declared := regexp.MustCompile(`\b(?:counter|gauge|histogram)(?:Vec)?\("([a-z0-9_]+)"`)
	for _, f := range sources {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range declared.FindAllStringSubmatch(string(src), -1) {
			names = append(names, observe.Namespace+"_"+m[1])
		}
	}
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	// A name may end in _* for a family of metrics (idem_extproc_region_*).
	metric := regexp.MustCompile(observe.Namespace + `_[a-z0-9_]*[a-z0-9](_\*)?`)
	seen := 0
	for _, f := range append(files, "../../README.md") {
		doc, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range metric.FindAllString(string(doc), -1) {
			seen++
			if family, ok := strings.CutSuffix(n, "*"); ok {
				if !slices.ContainsFunc(names, func(name string) bool { return strings.HasPrefix(name, family) }) {
					t.Errorf("%s names %s, a family of which the server exposes no metric", filepath.Base(f), n)
				}
				continue
			}
			base := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suffix); ok && slices.Contains(names, b+"_bucket") {
					base = b + "_bucket"
				}
			}
			if !slices.Contains(names, base) {
				t.Errorf("%s names %s, which the server does not expose", filepath.Base(f), n)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no metric named in the docs: the pattern is wrong")
	}
}

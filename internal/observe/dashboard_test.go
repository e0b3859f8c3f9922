package observe_test

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboardPanel is the part of a Grafana panel the test reads; rows nest
// their panels when collapsed.
type dashboardPanel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *datasourceRef           `json:"datasource"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// exposedNames scrapes the server's /metrics handler, every metric having
// a sample, and returns the sample names it serves (histograms as their
// _bucket, _sum and _count series, as PromQL sees them).
func exposedNames(t *testing.T) map[string]bool {
	m, _ := exercised(t)
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	names := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		names[name] = true
	}
	return names
}

// TestDashboardQueriesRealMetrics keeps observability/grafana-dashboard.json
// from rotting: it is a Grafana dashboard over a Prometheus data source
// variable, every panel queries through it, and every idem_extproc_*
// series it names (in panels and template variables) is one the server's
// /metrics serves. It also covers what the dashboard is for.
func TestDashboardQueriesRealMetrics(t *testing.T) {
	b, err := os.ReadFile("../../observability/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title         string `json:"title"`
		UID           string `json:"uid"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name       string          `json:"name"`
				Type       string          `json:"type"`
				Query      json.RawMessage `json:"query"`
				Definition string          `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []dashboardPanel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.Title == "" || dash.UID == "" || dash.SchemaVersion < 30 {
		t.Fatalf("not a current Grafana dashboard: title %q uid %q schemaVersion %d", dash.Title, dash.UID, dash.SchemaVersion)
	}
	exposed := exposedNames(t)
	metric := regexp.MustCompile(`idem_extproc_[a-z_]+`)
	used := map[string]bool{}
	checkExpr := func(where, expr string) {
		t.Helper()
		if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
			t.Errorf("%s: unbalanced expression %q", where, expr)
		}
		for _, name := range metric.FindAllString(expr, -1) {
			used[name] = true
			if !exposed[name] {
				t.Errorf("%s queries %s, which the server's /metrics does not serve", where, name)
			}
		}
	}

	hasDatasourceVar := false
	for _, v := range dash.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && string(v.Query) == `"prometheus"` {
			hasDatasourceVar = true
		}
		checkExpr("variable "+v.Name, string(v.Query)+" "+v.Definition)
	}
	if !hasDatasourceVar {
		t.Fatal("no Prometheus data source variable named datasource")
	}

	ids := map[int]string{}
	var titles []string
	var walk func(ps []dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
				t.Errorf("panel %q: gridPos %+v outside Grafana's 24 columns", p.Title, p.GridPos)
			}
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			titles = append(titles, p.Title)
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
				t.Errorf("panel %q must query the ${datasource} variable", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Expr == "" || tg.RefID == "" || tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q: target %q lacks an expression, refId or the ${datasource}", p.Title, tg.RefID)
				}
				checkExpr("panel "+p.Title, tg.Expr)
			}
		}
	}
	walk(dash.Panels)

	// What the dashboard is for: decisions by policy, store latency from
	// the histogram, unknown outcomes, adoption per policy, shadow.
	for _, want := range []string{"idem_extproc_decisions_total", "idem_extproc_store_call_duration_seconds_bucket",
		"idem_extproc_settle_failures_total", "idem_extproc_requests_total", "idem_extproc_shadow_decisions_total",
		"idem_extproc_key_warnings_total"} {
		if !used[want] {
			t.Errorf("the dashboard does not use %s", want)
		}
	}
	all := strings.ToLower(strings.Join(titles, "\n"))
	for _, want := range []string{"decisions by policy", "store latency", "unknown outcomes", "adoption", "shadow"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel about %q among %q", want, titles)
		}
	}
}

// fleetLabels are the target labels a fleet's Prometheus distinguishes
// servers by: the scrape job, the Kubernetes namespace and the cluster
// (the label a multi-cluster setup adds as an external label).
var fleetLabels = []string{"cluster", "namespace", "job"}

// TestDashboardIsForAFleet: the dashboard has cluster, namespace and job
// variables (multi-value, All matching every value, also a series without
// the label), and every idem_extproc_* selector of every panel and of the
// policy variable filters by all three, so that one dashboard serves many
// deployments without mixing them.
func TestDashboardIsForAFleet(t *testing.T) {
	b, err := os.ReadFile("../../observability/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
				IncludeAll bool   `json:"includeAll"`
				AllValue   string `json:"allValue"`
				Multi      bool   `json:"multi"`
			} `json:"list"`
		} `json:"templating"`
		Panels []dashboardPanel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	selector := regexp.MustCompile(`idem_extproc_[a-z_]+(\{[^}]*\})?`)
	checkSelectors := func(where, expr string) {
		t.Helper()
		sels := selector.FindAllStringSubmatch(expr, -1)
		if len(sels) == 0 {
			t.Errorf("%s: no idem_extproc_* series in %q", where, expr)
		}
		for _, m := range sels {
			for _, l := range fleetLabels {
				if !strings.Contains(m[1], l+`=~"$`+l+`"`) {
					t.Errorf("%s: %s does not filter by %s=~\"$%s\"", where, m[0], l, l)
				}
			}
		}
	}
	vars := map[string]bool{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = true
		switch {
		case v.Name == "policy":
			checkSelectors("variable policy", v.Definition)
		case slices.Contains(fleetLabels, v.Name):
			if v.Type != "query" || !v.IncludeAll || v.AllValue != ".*" || !v.Multi || !strings.Contains(v.Definition, ", "+v.Name+")") {
				t.Errorf("variable %s: want a multi-value label_values query of %s with All as .*", v.Name, v.Name)
			}
		}
	}
	for _, l := range append(fleetLabels, "policy") {
		if !vars[l] {
			t.Errorf("no %s variable", l)
		}
	}
	n := 0
	var walk func(ps []dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				n++
				checkSelectors("panel "+p.Title, tg.Expr)
			}
		}
	}
	walk(dash.Panels)
	if n < 10 {
		t.Fatalf("only %d queries", n)
	}
}

package admin

import (
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
)

// Counters gives the per-policy counters the adoption report summarises
// (observe.Metrics implements it).
type Counters interface {
	Counts() map[string]*observe.PolicyCounts
	Since() time.Time
}

// AdoptionReport answers GET /admin/v1/adoption: for each policy in force,
// how many requests carry keys and what enforcement does or would do, so a
// platform team can tell which APIs are ready to move to enforce. The
// counts are this server's since Since (one replica's view; Prometheus has
// the fleet's).
type AdoptionReport struct {
	Since    time.Time        `json:"since"`
	Policies []PolicyAdoption `json:"policies"`
}

// PolicyAdoption is one policy's line of the report.
type PolicyAdoption struct {
	Policy      string     `json:"policy"`
	Enforcement string     `json:"enforcement"`
	KeyRequired bool       `json:"key_required"`
	WarnUntil   *time.Time `json:"warn_until,omitempty"`
	// Requests the policy matched, with and without a key, and the share
	// with one (null before any request).
	Requests      uint64   `json:"requests"`
	WithKey       uint64   `json:"with_key"`
	WithoutKey    uint64   `json:"without_key"`
	AdoptionRatio *float64 `json:"adoption_ratio"`
	// KeyWarnings: requests let through without a required key during the
	// grace period.
	KeyWarnings uint64 `json:"key_warnings"`
	// Shadow is what the policy would have done while in shadow.
	Shadow ShadowCounts `json:"shadow"`
	// ReplaysServed are answers enforcement served from a record;
	// DuplicatesPrevented adds the 409s and 422s, every retry or reuse
	// that did not reach the upstream; Rejected the 400, 401 and 413s.
	ReplaysServed       uint64 `json:"replays_served"`
	DuplicatesPrevented uint64 `json:"duplicates_prevented"`
	Rejected            uint64 `json:"rejected"`
}

// ShadowCounts are a policy's shadow decisions. DuplicatesWouldBePrevented
// is what DuplicatesPrevented would have been under enforce.
type ShadowCounts struct {
	WouldReserve               uint64 `json:"would_reserve"`
	WouldReplay                uint64 `json:"would_replay"`
	WouldConflict              uint64 `json:"would_conflict"`
	WouldMismatch              uint64 `json:"would_mismatch"`
	WouldUnknown               uint64 `json:"would_unknown"`
	WouldReject                uint64 `json:"would_reject"`
	StoreErrors                uint64 `json:"store_errors"`
	DuplicatesWouldBePrevented uint64 `json:"duplicates_would_be_prevented"`
}

// report builds the report from the counters, for the policies in force.
func (a *api) report() AdoptionReport {
	counts := a.cfg.Counters.Counts()
	rep := AdoptionReport{Since: a.cfg.Counters.Since().UTC(), Policies: []PolicyAdoption{}}
	for _, p := range a.cfg.Policies().Policies {
		c := counts[p.Name]
		if c == nil {
			c = &observe.PolicyCounts{}
		}
		n := func(v float64) uint64 { return uint64(math.Round(v)) }
		d := func(x idem.Decision) uint64 { return n(c.Decisions[string(x)]) }
		s := func(x idem.ShadowDecision) uint64 { return n(c.Shadow[string(x)]) }
		pa := PolicyAdoption{
			Policy: p.Name, Enforcement: p.Enforcement.String(), KeyRequired: p.KeyRequired,
			WithKey: n(c.WithKey), WithoutKey: n(c.WithoutKey), KeyWarnings: n(c.KeyWarnings),
			Shadow: ShadowCounts{
				WouldReserve: s(idem.ShadowWouldReserve), WouldReplay: s(idem.ShadowWouldReplay),
				WouldConflict: s(idem.ShadowWouldConflict), WouldMismatch: s(idem.ShadowWouldMismatch),
				WouldUnknown: s(idem.ShadowWouldUnknown), WouldReject: s(idem.ShadowWouldReject),
				StoreErrors: s(idem.ShadowStoreError),
			},
			ReplaysServed: d(idem.DecisionReplayed),
			DuplicatesPrevented: d(idem.DecisionReplayed) + d(idem.DecisionConflict) +
				d(idem.DecisionMismatch) + d(idem.DecisionUnknown),
			Rejected: d(idem.DecisionRejected),
		}
		pa.Shadow.DuplicatesWouldBePrevented = pa.Shadow.WouldReplay + pa.Shadow.WouldConflict +
			pa.Shadow.WouldMismatch + pa.Shadow.WouldUnknown
		pa.Requests = pa.WithKey + pa.WithoutKey
		if pa.Requests > 0 {
			r := float64(pa.WithKey) / float64(pa.Requests)
			pa.AdoptionRatio = &r
		}
		if !p.KeyWarnUntil.IsZero() {
			w := p.KeyWarnUntil.UTC()
			pa.WarnUntil = &w
		}
		rep.Policies = append(rep.Policies, pa)
	}
	return rep
}

func (a *api) adoption(w http.ResponseWriter, r *http.Request) {
	a.record("adoption", "ok")
	a.cfg.Logger.LogAttrs(r.Context(), slog.LevelInfo, "admin action", slog.String("action", "adoption"),
		slog.String("result", "ok"), slog.String("remote", r.RemoteAddr))
	writeJSON(w, http.StatusOK, a.report())
}

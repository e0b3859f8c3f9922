package e2e

import (
	"net/http"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// TestHostileStoreReplyIsAStoreFailure: a store that answers a
// reservation with an array of 2^31 elements (which ended the process
// before the reply guard) fails that call as an unreachable store would:
// 503 idempotency-store-unavailable under fail_closed, the request passes
// under fail_open; it is counted, and the server answers the next request
// as usual.
func TestHostileStoreReplyIsAStoreFailure(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	h := redistest.NewHostile(t, srv.Addr())
	for mode, name := range map[policy.FailureMode]string{policy.FailClosed: "fail_closed", policy.FailOpen: "fail_open"} {
		p := policy.Default()
		p.FailureMode = mode
		metrics := observe.NewMetrics()
		env := harness.Start(t, harness.Options{
			Store: harness.RedisAt(h.URL()), Policies: &policy.Set{Policies: []*policy.Policy{p}},
			Metrics: metrics, // the harness's generous store budget: a refused reply fails at once, not by a timer
		})
		key := "hostile-" + name
		h.SetAttack(redistest.Attack{Commands: []string{"EVALSHA", "EVAL"}, Reply: redistest.HugeArray})
		r := env.Post("/orders", key, `{}`)
		h.SetAttack(redistest.Attack{})
		if mode == policy.FailClosed {
			wantProblem(t, r, problem.StoreUnavailable)
		} else {
			wantStatus(t, r, http.StatusCreated)
		}
		if n := counterTotal(t, metrics, "idem_extproc_store_failures_total"); n < 1 {
			t.Errorf("%s: %v store failures counted, want the refused reply", name, n)
		}
		wantStatus(t, env.Post("/orders", key+"-after", `{}`), http.StatusCreated)
	}
}

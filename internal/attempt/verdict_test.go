package attempt

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// shadowCounts records what a shadow policy reported.
type shadowCounts struct {
	idem.NopObserver
	shadow []idem.ShadowDecision
	warned int
}

func (o *shadowCounts) ShadowDecided(_ string, d idem.ShadowDecision) { o.shadow = append(o.shadow, d) }
func (o *shadowCounts) KeyWarned(string)                              { o.warned++ }

// want is a verdict as the tables state it.
type want struct {
	kind   verdictKind
	slug   string              // the problem's, for a refusal
	replay int                 // the replayed status, for a replay
	shadow idem.ShadowDecision // a shadow policy's decision
	add    string              // the name of the header added to the response
}

func checkVerdict(t *testing.T, v Verdict, w want) {
	t.Helper()
	if v.Kind != w.kind {
		t.Fatalf("verdict %+v, want kind %v", v, w.kind)
	}
	switch {
	case w.slug != "" && (v.Problem == nil || v.Problem.Slug != w.slug):
		t.Fatalf("problem %+v, want %q", v.Problem, w.slug)
	case w.slug == "" && v.Problem != nil:
		t.Fatalf("problem %+v, want none", v.Problem)
	case w.replay != 0 && (v.Replay == nil || v.Replay.Status != w.replay):
		t.Fatalf("replay %+v, want status %d", v.Replay, w.replay)
	case w.replay == 0 && v.Replay != nil:
		t.Fatalf("replay %+v, want none", v.Replay)
	case v.Shadow != w.shadow:
		t.Fatalf("shadow decision %q, want %q", v.Shadow, w.shadow)
	}
	if w.add == "" && len(v.Add) != 0 || w.add != "" && (len(v.Add) != 1 || v.Add[0].Name != w.add) {
		t.Fatalf("added headers %+v, want %q", v.Add, w.add)
	}
}

// TestAdmissionVerdictTable is docs/design.md §3's first table, the rows
// decided before any store call, as the verdicts the protocol side
// renders, under enforce and under shadow (§9: a shadow policy never
// answers in the upstream's place; it counts would_reject and passes).
func TestAdmissionVerdictTable(t *testing.T) {
	now := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	pol := func(change func(p *policy.Policy)) *policy.Policy {
		p := policy.Default()
		p.ShadowHeader = "idempotency-shadow"
		change(p)
		return p
	}
	enforce := func(*policy.Policy) {}
	shadow := func(p *policy.Policy) { p.Enforcement = policy.EnforcementShadow }
	for _, tc := range []struct {
		name        string
		change      func(*policy.Policy)
		raw         string
		lines       int
		scope       string
		want        want
		wantShadow  want
		graceWarned bool
	}{
		{"enforcement off", func(p *policy.Policy) { p.Enforcement = policy.EnforcementOff }, "k", 1, "t",
			want{kind: Pass}, want{kind: Pass}, false},
		{"no key, key optional", func(p *policy.Policy) { p.KeyRequired = false }, "", 0, "t",
			want{kind: Pass}, want{kind: Pass}, false},
		{"no key, key required, before key.warn_until", func(p *policy.Policy) {
			p.KeyRequired, p.KeyWarnUntil = true, now.Add(time.Hour)
		}, "", 0, "t", want{kind: Pass, add: "warning"}, want{kind: Pass}, true},
		{"no key, key required", func(p *policy.Policy) { p.KeyRequired = true }, "", 0, "t",
			want{kind: answered, slug: problem.KeyMissing.Slug},
			want{kind: Pass, shadow: idem.ShadowWouldReject, add: "idempotency-shadow"}, false},
		{"key malformed", enforce, "a,b", 1, "t",
			want{kind: answered, slug: problem.KeyInvalid.Slug},
			want{kind: Pass, shadow: idem.ShadowWouldReject, add: "idempotency-shadow"}, false},
		{"scope source yields nothing", func(p *policy.Policy) {
			p.Scope = policy.Scope{Source: policy.ScopeHeader, Header: "x-tenant"}
		}, "k", 1, "",
			want{kind: answered, slug: problem.PrincipalMissing.Slug},
			want{kind: Pass, shadow: idem.ShadowWouldReject, add: "idempotency-shadow"}, false},
		{"key valid, scoped", enforce, "k", 1, "t", want{kind: Continue}, want{kind: Continue}, false},
	} {
		for _, mode := range []struct {
			name   string
			change func(*policy.Policy)
			want   want
		}{{"enforce", enforce, tc.want}, {"shadow", shadow, tc.wantShadow}} {
			t.Run(tc.name+"/"+mode.name, func(t *testing.T) {
				p := pol(tc.change)
				if p.Enforcement != policy.EnforcementOff {
					mode.change(p)
				}
				obs := &shadowCounts{}
				a := New(&Server{Observer: obs, Log: slog.New(slog.DiscardHandler)}, &reporter{})
				a.Policy = p
				adm, key, prob := a.admitKey(tc.raw, tc.lines, now)
				v := a.admitted(adm, prob)
				if v.Kind == Continue {
					_, required := a.scopeOf(p, facts{})
					v = a.named(tc.scope, required, key)
				}
				checkVerdict(t, v, mode.want)
				if got := obs.warned == 1; got != (tc.graceWarned && mode.name == "enforce") {
					t.Fatalf("grace warnings counted %d", obs.warned)
				}
				if mode.want.shadow != "" && (len(obs.shadow) != 1 || obs.shadow[0] != mode.want.shadow) {
					t.Fatalf("shadow decisions counted %v, want %v", obs.shadow, mode.want.shadow)
				}
			})
		}
	}
}

// TestRefusalVerdicts: the refusals made while the body is read (too
// large, cut at the proxy's buffer, the server's buffers full) go through
// the same rule: answered under enforce, counted and passed under shadow.
func TestRefusalVerdicts(t *testing.T) {
	for _, prob := range []*problem.Problem{
		BodyTooLarge(10), problem.New(problem.BodyIncomplete, "cut"), problem.New(problem.CapacityExceeded, "full"),
	} {
		p := policy.Default()
		a := New(&Server{Observer: idem.NopObserver{}, Log: slog.New(slog.DiscardHandler)}, &reporter{})
		a.Policy = p
		checkVerdict(t, a.refuse(prob), want{kind: answered, slug: prob.Slug})
		p.Enforcement = policy.EnforcementShadow
		checkVerdict(t, a.refuse(prob), want{kind: Pass, shadow: idem.ShadowWouldReject})
	}
}

// TestRequestVerdictTable is §3's second table, what the reservation
// finds, as the verdicts rendered: under enforce (including both failure
// modes of a store that cannot be asked, and a stored response that does
// not open) and under shadow, which answers nothing and tells what
// enforcement would have done (§9).
func TestRequestVerdictTable(t *testing.T) {
	ctx := context.Background()
	completed := func(t *testing.T, d *decider) {
		d.first(t, fp1).settleStored(ctx, idem.Response{Status: 201, Body: []byte("ok")})
	}
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, d *decider)
		fp     idem.Fingerprint
		store  func(d *decider) // changes the store after the history
		change func(p *policy.Policy)
		enf    want
		shadow want
	}{
		{"none: reserved", nil, fp1, nil, nil,
			want{kind: Continue}, want{kind: Continue, shadow: idem.ShadowWouldReserve, add: "idempotency-shadow"}},
		{"any state, differs: 422", completed, fp2, nil, nil,
			want{kind: answered, slug: problem.KeyReused.Slug}, want{kind: Pass, shadow: idem.ShadowWouldMismatch, add: "idempotency-shadow"}},
		{"in flight, same: 409", func(t *testing.T, d *decider) { d.first(t, fp1) }, fp1, nil, nil,
			want{kind: answered, slug: problem.InProgress.Slug}, want{kind: Pass, shadow: idem.ShadowWouldConflict, add: "idempotency-shadow"}},
		{"in flight, same, wait_for_in_flight: wait", func(t *testing.T, d *decider) { d.first(t, fp1) }, fp1, nil,
			func(p *policy.Policy) { p.WaitForInFlight = time.Second },
			want{kind: Wait}, want{kind: Pass, shadow: idem.ShadowWouldConflict, add: "idempotency-shadow"}},
		{"completed, same: replay", completed, fp1, nil, nil,
			want{kind: answered, replay: 201}, want{kind: Pass, shadow: idem.ShadowWouldReplay, add: "idempotency-shadow"}},
		{"unknown, same: 409 outcome-unknown", func(t *testing.T, d *decider) {
			d.first(t, fp1).settle(ctx, idem.ActionUnknown)
		}, fp1, nil, nil,
			want{kind: answered, slug: problem.OutcomeUnknown.Slug}, want{kind: Pass, shadow: idem.ShadowWouldUnknown, add: "idempotency-shadow"}},
		{"store unreachable, fail_closed: 503", nil, fp1, func(d *decider) { d.srv.Store = down{d.store} }, nil,
			want{kind: answered, slug: problem.StoreUnavailable.Slug}, want{kind: Pass, shadow: idem.ShadowStoreError, add: "idempotency-shadow"}},
		{"store unreachable, fail_open: passed", nil, fp1, func(d *decider) { d.srv.Store = down{d.store} },
			func(p *policy.Policy) { p.FailureMode = policy.FailOpen },
			want{kind: Pass}, want{kind: Pass, shadow: idem.ShadowStoreError, add: "idempotency-shadow"}},
		{"encrypt without a key ring: 503 whatever the failure mode", nil, fp1, nil,
			func(p *policy.Policy) { p.Encrypt, p.FailureMode = true, policy.FailOpen },
			want{kind: answered, slug: problem.StoreUnavailable.Slug}, want{kind: Pass, shadow: idem.ShadowStoreError, add: "idempotency-shadow"}},
	} {
		for _, mode := range []string{"enforce", "shadow"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				p := policy.Default()
				p.ShadowHeader = "idempotency-shadow"
				if tc.change != nil {
					tc.change(p)
				}
				w := tc.enf
				if mode == "shadow" {
					p.Enforcement, w = policy.EnforcementShadow, tc.shadow
				}
				d := newDecider(t, p)
				if tc.before != nil {
					tc.before(t, d)
				}
				if tc.store != nil {
					tc.store(d)
				}
				rep := &reporter{}
				a := d.attempt(rep)
				v := a.request(ctx, tc.fp)
				checkVerdict(t, v, w)
				if held := a.renew != nil; held != (v.Kind == Continue) {
					t.Fatalf("holds the record: %v after a %v verdict", held, v.Kind)
				}
				if a.renew != nil {
					stopRenewing(a)
				}
				if v.Kind == Wait {
					if v.Wait != p.WaitForInFlight+3*d.srv.StoreTimeout {
						t.Fatalf("wait %v", v.Wait)
					}
					return
				}
				if len(rep.decisions) != 1 {
					t.Fatalf("decisions %v, want one", rep.decisions)
				}
			})
		}
	}
}

// TestAwaitVerdicts: after a Wait verdict, Await answers from what the
// first attempt did meanwhile (§3, "Waiting for the first attempt").
func TestAwaitVerdicts(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		settle func(first *Attempt)
		want   want
	}{
		{"completed: replay", func(f *Attempt) { f.settleStored(ctx, idem.Response{Status: 201}) }, want{kind: answered, replay: 201}},
		{"released: this attempt reserves", func(f *Attempt) { f.settle(ctx, idem.ActionRelease) }, want{kind: Continue}},
		{"unknown: 409 outcome-unknown", func(f *Attempt) { f.settle(ctx, idem.ActionUnknown) }, want{kind: answered, slug: problem.OutcomeUnknown.Slug}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.Default()
			p.WaitForInFlight = 30 * time.Second
			d := newDecider(t, p)
			first := d.first(t, fp1)
			a := d.attempt(d.conv)
			if v := a.request(ctx, fp1); v.Kind != Wait {
				t.Fatalf("verdict %+v, want a wait", v)
			}
			tc.settle(first)
			v := a.Await(ctx)
			checkVerdict(t, v, tc.want)
			if a.renew != nil {
				stopRenewing(a)
			}
		})
	}
}

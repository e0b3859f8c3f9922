package attempt

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// mapHome is a finder whose map homes every scope in home, which is or is
// not this server's region; its store is the home's.
type mapHome struct {
	farHome
	home string
	here bool
}

func (m mapHome) HomeOf(*policy.Policy, string) (string, bool) { return m.home, m.here }

// TestSendHome: where a named request runs (Named). A request of an
// enforced policy whose scope is homed in another region is sent there
// when the server sends requests home and the proxy can route it, and then
// nothing is asked of any store here; a request another region's server
// sent here is never sent on: it is decided here when this server's map
// agrees that here is its home, and refused 503 idempotency-homes-disagree
// when it does not (two maps that disagree: at most one hop, no
// execution). Without the option every request takes the path it took
// before.
func TestSendHome(t *testing.T) {
	for _, c := range []struct {
		name     string
		sendHome bool
		routing  Routing
		here     bool
		shadow   bool
		want     verdictKind
		slug     string
	}{
		{"homed elsewhere: sent home", true, Routing{CanSend: true}, false, false, SendHome, ""},
		{"without the option, or a region the proxy has no route for: decided here", false, Routing{CanSend: true}, false, false, Continue, ""},
		{"a proxy that cannot route: decided here", true, Routing{}, false, false, Continue, ""},
		{"a shadow policy is never moved", true, Routing{CanSend: true}, false, true, Continue, ""},
		{"homed here: decided here", true, Routing{CanSend: true}, true, false, Continue, ""},
		{"sent here, homed here: decided here, never sent on", true, Routing{SentTo: "home", CanSend: true}, true, false, Continue, ""},
		{"sent here, this map homes it elsewhere: refused", true, Routing{SentTo: "home", CanSend: true}, false, false, answered, problem.HomesDisagree.Slug},
		{"sent here under another region's name: refused", true, Routing{SentTo: "other", CanSend: true}, true, false, answered, problem.HomesDisagree.Slug},
	} {
		t.Run(c.name, func(t *testing.T) {
			far := memstore.New(memstore.Options{})
			finder := mapHome{farHome: farHome{far, 450 * time.Millisecond}, home: "home", here: c.here}
			var sendTo []string
			if c.sendHome {
				sendTo = []string{"home"}
			}
			srv := &Server{Store: memstore.New(memstore.Options{}), Homes: finder, SendHome: sendTo, Observer: idem.NopObserver{},
				Log: slog.New(slog.DiscardHandler), StoreTimeout: 100 * time.Millisecond, SettleAtEndTimeout: time.Second}
			p := policy.Default()
			p.Homes = &policy.Homes{Epoch: 1, Default: "home"}
			if c.shadow {
				p.Enforcement = policy.EnforcementShadow
			}
			rep := &reporter{}
			a := New(srv, rep)
			a.Policy, a.Routing = p, c.routing
			v := a.named("scope", false, "k1")
			if v.Kind != c.want || (c.slug != "" && (v.Problem == nil || v.Problem.Slug != c.slug)) {
				t.Fatalf("verdict %+v, want kind %d %s", v, c.want, c.slug)
			}
			switch c.want {
			case SendHome:
				if v.Home != "home" || a.home != nil || len(rep.decisions) != 1 || rep.decisions[0] != idem.DecisionSentHome {
					t.Fatalf("sent to %q, record store %v, decisions %v; want home, none, sent_home", v.Home, a.home, rep.decisions)
				}
			case Continue:
				if a.home == nil {
					t.Fatal("a request decided here has no home store")
				}
			}
			if c.want != Continue {
				if _, err := far.Get(context.Background(), a.ID); err == nil {
					t.Fatal("a request sent home or refused left a record")
				}
			}
		})
	}
}

// countingHomes counts the lookups of a scope's home.
type countingHomes struct {
	farHome
	lookups *int
}

func (c countingHomes) HomeOf(p *policy.Policy, scope string) (string, bool) {
	*c.lookups++
	return c.farHome.HomeOf(p, scope)
}

// TestRouteLooksUpNothingToSend: a server that sends no request home
// (--region-send-home empty), given a request no other region's server
// sent, decides it here without asking the map for the scope's home:
// whatever the answer, nothing would be sent.
func TestRouteLooksUpNothingToSend(t *testing.T) {
	lookups := 0
	srv := &Server{Store: memstore.New(memstore.Options{}),
		Homes:    countingHomes{farHome{memstore.New(memstore.Options{}), 450 * time.Millisecond}, &lookups},
		Observer: idem.NopObserver{}, Log: slog.New(slog.DiscardHandler), StoreTimeout: 100 * time.Millisecond}
	p := policy.Default()
	p.Homes = &policy.Homes{Epoch: 1, Default: "far"}
	a := New(srv, &reporter{})
	a.Policy, a.Routing = p, Routing{CanSend: true}
	if v := a.named("scope", false, "k1"); v.Kind != Continue || a.home == nil {
		t.Fatalf("verdict %+v, home store %v; want Continue decided here", v, a.home)
	}
	if lookups != 0 {
		t.Fatalf("%d lookups of the scope's home, want none", lookups)
	}
}

package multiregion_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// homeRoutes is region from's route configuration when servers send
// requests home (envoy/envoy-regions.yaml's shape): a route per other
// region matching the home header, then the local one; the header is
// internal only, so a client never chooses a route with it.
func (b *bed) homeRoutes(from string) envoysim.Options {
	var routes []envoysim.Route
	for _, to := range regionNames {
		if to != from {
			routes = append(routes, envoysim.Route{Name: "home-" + to, Header: extproc.HomeHeader, Value: to, Upstream: b.sendTo(from, to)})
		}
	}
	routes = append(routes, envoysim.Route{Name: "orders"})
	return envoysim.Options{Routes: routes, InternalOnlyHeaders: []string{extproc.HomeHeader}}
}

// sendTo is the cluster of region to's peer front as region from reaches
// it: over a WAN link of the bed's round trip, made when first used (the
// peer fronts start after the routes that name them).
func (b *bed) sendTo(from, to string) envoysim.Upstream {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.t.Cleanup(client.CloseIdleConnections)
	return func(ctx context.Context, req *envoysim.Request) (*envoysim.Response, error) {
		b.homeMu.Lock()
		if b.homeLinks == nil {
			b.homeLinks = map[string]*redistest.DelayLink{}
		}
		l, ok := b.homeLinks[from+">"+to]
		if !ok {
			u, _ := url.Parse(b.regions[to].peer.URL)
			l = redistest.NewDelayLink(b.t, u.Host)
			l.SetDelay(b.opts.rtt/2, b.opts.rtt/2)
			l.SetJitter(b.opts.jitter, b.opts.jitter)
			b.homeLinks[from+">"+to] = l
		}
		b.homeMu.Unlock()
		base, _ := url.Parse("http://" + l.Addr())
		return envoysim.HTTPUpstream(client, base, 0)(ctx, req)
	}
}

// TestSendHomeCostsOneCrossing measures, at 80 ms between regions and with
// the shipped timers, first writes and replays entering eu for a tenant
// homed in us, on the two paths: eu's server calling us's store (a
// reservation and a settlement across the WAN), and eu sending the request
// home (--region-send-home), where us's server reserves in its own store.
// It reports the medians in the test log and never fails on time; it
// fails when a key runs twice, a write is not answered 201, or, sent home,
// eu's server calls us's store at all.
//
//	go test ./test/multiregion -run SendHomeCostsOneCrossing -v
func TestSendHomeCostsOneCrossing(t *testing.T) {
	const n = 10
	const rtt = 80 * time.Millisecond
	for _, sendHome := range []bool{false, true} {
		name := map[bool]string{false: "remote store", true: "sent home"}[sendHome]
		t.Run(name, func(t *testing.T) {
			bed := newBed(t, bedOptions{rtt: rtt, storeTimeout: 100 * time.Millisecond, sendHome: sendHome,
				messageTimeout: 300 * time.Millisecond, maxMessageTimeout: 2500 * time.Millisecond})
			l := newLedger()
			keys := make([]string, n)
			// A store call that ran past the shipped 100 ms (a busy machine's
			// stall, not a WAN's) is answered 503 before any effect, and the
			// test retries it as a client would: a first write with a new
			// key (a reservation whose reply came late makes the same key
			// 409 in-progress; the old key stays in the ledger, where an
			// execution of it would count), a replay with its key. The
			// medians are of the answered attempts; the retries are logged.
			retries := 0
			timed := func(key string, first bool) (string, time.Duration) {
				for {
					l.bodies[key], l.tenants[key] = `{"n":1}`, "t-us-1"
					start := time.Now()
					r := bed.post("eu", key, "t-us-1", `{"n":1}`, 10*time.Second)
					d := time.Since(start)
					l.add(key, answerOf(r, "eu"))
					if r.Status == 503 && strings.Contains(string(r.Body), "idempotency-store-unavailable") && retries < n {
						retries++
						if first {
							key = newKey(false)
						}
						continue
					}
					if r.Status != 201 {
						t.Errorf("key %s: %d %v %.200s", key, r.Status, r.Err, r.Body)
					}
					return key, d
				}
			}
			var first, replay []time.Duration
			for i := range keys {
				k, d := timed(newKey(false), true)
				keys[i], first = k, append(first, d)
			}
			for _, k := range keys {
				_, d := timed(k, false)
				replay = append(replay, d)
			}
			if dups, executed, _ := bed.oracle(t, l); dups != 0 || executed != n {
				t.Fatalf("%d keys ran twice, %d ran once; want 0 and %d", dups, executed, n)
			}
			calls := bed.counter("eu", "idem_extproc_region_store_call_duration_seconds", map[string]string{"region": "us"})
			sent := bed.counter("eu", "idem_extproc_decisions_total", map[string]string{"decision": "sent_home"})
			// Every attempt is sent home, a retried one too.
			if sendHome && (calls != 0 || sent < float64(2*n) || sent > float64(2*n+retries)) {
				t.Errorf("sent home: eu made %v calls to us's store and sent %v requests home; want 0 and %d to %d", calls, sent, 2*n, 2*n+retries)
			}
			t.Logf("%v between regions, %s: first write p50 %v, replay p50 %v (%d each, entering eu, homed in us; eu's calls to us's store: %v; retried after a 503: %d)",
				rtt, name, median(first), median(replay), n, calls, retries)
		})
	}
}

// TestSendHomeMapsDisagree: eu's map homes t-x in us and us's homes it in
// eu. A write entering either region is sent to the other once, and there
// refused 503 idempotency-homes-disagree: the receiving server never sends
// a request that was sent to it, and never runs one its map homes
// elsewhere. Nothing executes, nothing is left outcome-unknown.
func TestSendHomeMapsDisagree(t *testing.T) {
	bed := newBed(t, bedOptions{rtt: 30 * time.Millisecond, storeTimeout: 100 * time.Millisecond, sendHome: true})
	homes := func(region string) string {
		return "homes:\n  epoch: 2\n  default: eu\n  rules:\n    - {scopes: [t-x], region: " + region + "}\n"
	}
	bed.setHomes(2, homes("us"), "eu")
	bed.setHomes(2, homes("eu"), "us")
	for _, c := range []struct{ enter, other string }{{"eu", "us"}, {"us", "eu"}} {
		key := newKey(false)
		before := map[string]int{}
		for _, name := range regionNames {
			before[name] = len(bed.regions[name].peer.Results())
		}
		r := bed.post(c.enter, key, "t-x", `{"n":1}`, 10*time.Second)
		if r.Status != 503 || !strings.Contains(r.Body, "idempotency-homes-disagree") {
			t.Errorf("entering %s: %d %v %.300s; want 503 idempotency-homes-disagree", c.enter, r.Status, r.Err, r.Body)
		}
		if got := bed.up.CountKey(key); got != 0 {
			t.Errorf("entering %s: the key ran %d times, want 0", c.enter, got)
		}
		entered := bed.regions[c.enter].env.Results()
		if last := entered[len(entered)-1]; last.UpstreamRequest == nil || last.UpstreamRequest.RouteName != "home-"+c.other {
			t.Errorf("entering %s: not sent to %s: %v", c.enter, c.other, last)
		}
		// One hop: the other region's peer front saw the request once
		// and sent it nowhere; no peer front saw it come back.
		for _, name := range regionNames {
			hops := bed.regions[name].peer.Results()[before[name]:]
			want := 0
			if name == c.other {
				want = 1
			}
			if len(hops) != want || (want == 1 && hops[0].UpstreamCalled) {
				t.Errorf("entering %s: %s's peer front saw %d requests, want %d, none sent on", c.enter, name, len(hops), want)
			}
		}
	}
}

// median is the middle of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}

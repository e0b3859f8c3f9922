package multiregion_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// movedHomes moves t-ap-moved from ap to us, as of now; the other tenants
// stay where homesV1 puts them.
func movedHomes() string {
	return fmt.Sprintf(`homes:
  epoch: 2
  default: eu
  rules:
    - {scopes: [t-ap-moved], region: us, moved_from: ap, moved_at: '%s'}
    - {scopes: ['t-us-*'], region: us}
    - {scopes: ['t-ap-*'], region: ap}
`, time.Now().UTC().Format(time.RFC3339))
}

// TestEveryPathWithinEnvoysTimers: with the shipped filter's timers
// (message_timeout 300 ms, max_message_timeout 2.5 s) and the default
// --store-timeout (100 ms), every cross-region path is answered, at 30 to
// 250 ms between regions:
//
//   - a first write homed in another region, and its retry from a third;
//   - servers still on the old map retrying keys the moved scope's new
//     home made: ap, the former home, whose own store answers with a
//     tombstone (it asks Envoy for us's time, then follows), and eu, for
//     which ap is far (the tombstone is followed within the time asked);
//   - a first write of the moving scope through a server on the new map
//     (the hand-over at ap, then the reservation at us), and its retry;
//   - two attempts of one key at once, 2 s wait_for_in_flight, far home:
//     the wait is shortened to what Envoy grants.
//
// The oracle: no key executed twice, every success the execution's answer,
// no key answered outcome-unknown that never ran. A path whose every
// attempt is answered 5xx (a 503 of the server's, or Envoy's 504 when its
// timer ran out) fails too: that is a budget or a timer too short by
// construction. A lone 5xx is logged, not failed: on a loaded machine a
// call may outlast Envoy's timer, and no test fails on wall-clock time.
func TestEveryPathWithinEnvoysTimers(t *testing.T) {
	const keysPerPath = 3
	for _, rtt := range []time.Duration{30, 80, 150, 200, 250} {
		rtt *= time.Millisecond
		t.Run(fmt.Sprint(rtt), func(t *testing.T) {
			bed := newBed(t, bedOptions{rtt: rtt, storeTimeout: 100 * time.Millisecond,
				messageTimeout: 300 * time.Millisecond, maxMessageTimeout: 2500 * time.Millisecond})
			l := newLedger()
			var failed []string
			tried, refused := map[string]int{}, map[string]int{}
			var mu sync.Mutex
			do := func(r, path, key, tenant string) {
				body := `{"n":1}`
				rep := bed.postTo(r, path, key, tenant, body, 10*time.Second)
				l.mu.Lock()
				l.bodies[key], l.tenants[key] = body, tenant
				l.mu.Unlock()
				l.add(key, answerOf(rep, r))
				mu.Lock()
				defer mu.Unlock()
				at := r + " " + tenant + " " + path
				tried[at]++
				if rep.Err != nil || rep.Status >= 500 {
					refused[at]++
					failed = append(failed, fmt.Sprintf("%s: %d %v %.120s", at, rep.Status, rep.Err, rep.Body))
				}
			}
			moved := movedHomes()
			bed.setHomes(2, moved, "us") // eu and ap stay on the old map
			for range keysPerPath {
				k := newKey(false)
				do("eu", "/orders", k, "t-us-1")
				do("ap", "/orders", k, "t-us-1")
				k = newKey(false)
				do("us", "/orders", k, "t-ap-moved")
				do("ap", "/orders", k, "t-ap-moved")
				do("eu", "/orders", k, "t-ap-moved")
			}
			bed.setHomes(2, moved, "eu")
			for range keysPerPath {
				k := newKey(false)
				do("eu", "/orders", k, "t-ap-moved")
				do("us", "/orders", k, "t-ap-moved")
				k = newKey(false)
				var wg sync.WaitGroup
				for _, r := range []string{"eu", "ap"} {
					wg.Go(func() { do(r, "/waits", k, "t-us-2") })
				}
				wg.Wait()
			}
			dups, executed, _ := bed.oracle(t, l)
			stranded := 0
			ran := map[string]bool{}
			for _, e := range bed.up.Effects() {
				ran[e.Key] = true
			}
			for key, as := range l.answers {
				for _, a := range as {
					if strings.Contains(a.body, "outcome-unknown") && !ran[key] {
						stranded++
						break
					}
				}
			}
			t.Logf("rtt %v: %d keys, %d executed, %d executed twice, %d stranded outcome-unknown, %d answers 5xx; answers %v",
				rtt, len(l.bodies), executed, dups, stranded, len(failed), l.statuses())
			if len(failed) > 0 {
				t.Logf("5xx answers:\n%s", strings.Join(failed, "\n"))
			}
			if dups > 0 || stranded > 0 {
				t.Errorf("%d executed twice, %d stranded outcome-unknown", dups, stranded)
			}
			for at, n := range refused {
				if n == tried[at] {
					t.Errorf("every attempt entering %s was answered 5xx (%d)", at, n)
				}
			}
			if n := bed.counter("ap", "idem_extproc_region_moved_total", nil) + bed.counter("eu", "idem_extproc_region_moved_total", nil); n < 2*keysPerPath {
				t.Errorf("tombstones followed by the old map's servers: %v, want %d", n, 2*keysPerPath)
			}
		})
	}
}

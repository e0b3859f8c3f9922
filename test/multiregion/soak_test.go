package multiregion_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// op is one operation: its key, scope and request.
type op struct {
	key, tenant, body string
}

// driveOptions shape how a client retries one operation.
type driveOptions struct {
	// entries are the regions attempts may enter, picked at random.
	entries []string
	// loseFirst drops the first success on its way back (the client
	// timed out): the client retries, in another region.
	loseFirst bool
	// twice sends the first attempt into two regions at once.
	twice bool
}

const (
	// maxAttempts bounds a client's retries of one operation.
	maxAttempts = 12
	// attemptTimeout is a client's wait for one answer.
	attemptTimeout = 5 * time.Second
)

// drive runs op as a client would: attempts until a success it keeps, an
// outcome-unknown answer, or maxAttempts.
func (b *bed) drive(l *ledger, o op, do driveOptions, rng *rand.Rand) {
	l.mu.Lock()
	l.bodies[o.key], l.tenants[o.key] = o.body, o.tenant
	l.mu.Unlock()
	pick := func() string { return do.entries[rng.IntN(len(do.entries))] }
	lost := !do.loseFirst
	for i := range maxAttempts {
		entry := pick()
		if i == 0 && do.twice {
			other := do.entries[(indexOf(do.entries, entry)+1)%len(do.entries)]
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := b.post(other, o.key, o.tenant, o.body, attemptTimeout)
				if r.Err == nil {
					l.add(o.key, answerOf(r, other))
				}
			}()
			defer wg.Wait()
		}
		r := b.post(entry, o.key, o.tenant, o.body, attemptTimeout)
		if r.Err != nil {
			continue // lost on the way: retry
		}
		switch {
		case r.Status >= 200 && r.Status < 300:
			if !lost {
				lost = true // the client never saw it; it retries elsewhere
				l.add(o.key, answerOf(r, entry+"(lost)"))
				continue
			}
			l.add(o.key, answerOf(r, entry))
			return
		case strings.Contains(r.Body, "outcome-unknown"):
			l.add(o.key, answerOf(r, entry))
			return
		}
		l.add(o.key, answerOf(r, entry))
		time.Sleep(time.Duration(20+rng.IntN(40)) * time.Millisecond)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return 0
}

// workload runs n operations, 8 clients at once, each from gen.
func (b *bed) workload(l *ledger, n int, seed uint64, gen func(i int, rng *rand.Rand) (op, driveOptions)) {
	var wg sync.WaitGroup
	work := make(chan int)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range work {
				o, do := gen(i, rng)
				b.drive(l, o, do, rng)
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

// mixed is the soak's operations: a tenant homed in any region, attempts
// entering any of entries, 30 % of first answers lost, 10 % sent twice at
// once, half the keys UUIDv7.
func mixed(phase string, entries []string, tenants []string) func(int, *rand.Rand) (op, driveOptions) {
	return func(i int, rng *rand.Rand) (op, driveOptions) {
		tenant := tenants[rng.IntN(len(tenants))]
		return op{key: newKey(rng.IntN(2) == 0), tenant: tenant, body: fmt.Sprintf(`{"phase":%q,"n":%d}`, phase, i)},
			driveOptions{entries: entries, loseFirst: rng.IntN(10) < 3, twice: rng.IntN(10) == 0}
	}
}

var allTenants = []string{"t-eu-1", "t-eu-2", "t-us-1", "t-us-2", "t-ap-1", "t-ap-2"}

// TestSoakAcrossRegions: operations whose attempts enter different regions,
// 10 % sent twice at once and 30 % of first answers lost, through a
// two-way and a one-way partition, an isolated home, a home whose Redis is
// killed mid-partition, a scope moved while one region still holds the
// old map, and a declared failover. Each operation runs at most once, and
// every success is byte-identical to its execution's answer.
func TestSoakAcrossRegions(t *testing.T) {
	b := newBed(t, bedOptions{rtt: 10 * time.Millisecond, jitter: 2 * time.Millisecond, persist: true})
	l := newLedger()
	var mu sync.Mutex
	phaseKeys := map[string][]string{}
	record := func(phase string) func(int, *rand.Rand) (op, driveOptions) {
		gen := mixed(phase, regionNames, allTenants)
		return func(i int, rng *rand.Rand) (op, driveOptions) {
			o, do := gen(i, rng)
			mu.Lock()
			phaseKeys[phase] = append(phaseKeys[phase], o.key)
			mu.Unlock()
			return o, do
		}
	}

	t.Log("steady")
	b.workload(l, 90, 1, record("steady"))

	t.Log("partitions: us's store cut from the others both ways, ap's one way (requests reach it, answers do not)")
	b.cut("us", true, true)
	b.cut("ap", false, true)
	b.workload(l, 30, 2, record("partition"))
	b.heal("us")
	b.heal("ap")
	b.workload(l, 20, 3, record("healed"))

	t.Log("an isolated home: eu's store unreachable from us and ap, and resets on the links that remain")
	b.cut("eu", true, true)
	for _, ls := range b.links {
		for to, lk := range ls {
			if to != "eu" {
				lk.Reset()
			}
		}
	}
	b.workload(l, 20, 4, record("isolated"))
	b.heal("eu")

	t.Log("us's Redis killed during a partition, then restarted from its append-only file")
	b.cut("us", true, true)
	b.regions["us"].redis.Kill()
	b.workload(l, 20, 5, record("killed"))
	b.regions["us"].redis.Restart()
	b.heal("us")
	b.workload(l, 20, 6, record("restarted"))

	t.Log("t-ap-1 moved from ap to us; ap still holds the old map")
	moved := fmt.Sprintf(`homes:
  epoch: 2
  default: eu
  rules:
    - {scopes: ['t-us-*', t-ap-1], region: us}
    - {scopes: [t-ap-1], region: us, moved_from: ap, moved_at: '%s'}
    - {scopes: ['t-ap-*'], region: ap}
`, time.Now().UTC().Format(time.RFC3339))
	moved = strings.Replace(moved, "['t-us-*', t-ap-1]", "['t-us-*']", 1)
	b.setHomes(2, moved, "eu", "us")
	b.workload(l, 40, 7, record("moved"))
	// Retries of keys answered before the move, entering any region.
	b.retryOld(l, phaseKeys["steady"][:30], regionNames, 8)
	// The move engaged: the new home asked ap about t-ap-1's keys first,
	// and ap, on the old map, was sent on to us by the tombstones.
	if n := b.counter("us", "idem_extproc_region_handovers_total", map[string]string{"from": "ap", "outcome": "handed_over"}) +
		b.counter("eu", "idem_extproc_region_handovers_total", map[string]string{"from": "ap", "outcome": "handed_over"}); n == 0 {
		t.Error("no key of the moved scope was handed over")
	}
	t.Logf("ap, on the old map, sent on by a tombstone %v times", b.counter("ap", "idem_extproc_region_moved_total", map[string]string{"home": "us"}))

	t.Log("ap declared lost: its scopes fail over to eu; ap is cut off and gets no traffic")
	b.cut("ap", true, true)
	failover := fmt.Sprintf(`homes:
  epoch: 3
  default: eu
  key_clock_skew: 1s
  rules:
    - {scopes: ['t-us-*'], region: us}
    - {scopes: [t-ap-1], region: us, moved_from: ap, moved_at: '%[1]s', lost: true}
    - {scopes: ['t-ap-*'], region: eu, moved_from: ap, moved_at: '%[1]s', lost: true}
`, time.Now().Add(-2*time.Second).UTC().Format(time.RFC3339))
	b.setHomes(3, failover, "eu", "us")
	survivors := []string{"eu", "us"}
	b.workload(l, 30, 9, mixed("failover", survivors, allTenants))
	b.retryOld(l, phaseKeys["steady"][30:60], survivors, 10)

	if n := b.counter("eu", "idem_extproc_region_quarantined_total", map[string]string{"lost": "ap"}) +
		b.counter("us", "idem_extproc_region_quarantined_total", map[string]string{"lost": "ap"}); n == 0 {
		t.Error("no key of the lost region was quarantined")
	}
	t.Logf("answers by status: %v", l.statuses())
	dups, executed, unanswered := b.oracle(t, l)
	t.Logf("%d operations: %d executed once, %d more than once, %d never answered with a success (unknown or refused)",
		len(l.bodies), executed, dups, unanswered)
	if dups != 0 {
		t.Errorf("%d keys executed more than once", dups)
	}
	if executed < len(l.bodies)/2 {
		t.Errorf("only %d of %d operations executed: the bed refused too much to prove anything", executed, len(l.bodies))
	}
}

// retryOld retries keys already driven, with the same request, as a
// client whose earlier answer was lost does.
func (b *bed) retryOld(l *ledger, keys []string, entries []string, seed uint64) {
	l.mu.Lock()
	ops := make([]op, 0, len(keys))
	for _, k := range keys {
		ops = append(ops, op{key: k, tenant: l.tenants[k], body: l.bodies[k]})
	}
	l.mu.Unlock()
	b.workload(l, len(ops), seed, func(i int, rng *rand.Rand) (op, driveOptions) {
		return ops[i], driveOptions{entries: entries}
	})
}

// TestNegativeControlIndependentStores: the same clients against three
// regions that each keep their own store and no homes. Retries entering
// another region run again: the oracle must see it, or the soak proves
// nothing.
func TestNegativeControlIndependentStores(t *testing.T) {
	b := newBed(t, bedOptions{rtt: 10 * time.Millisecond, independent: true})
	l := newLedger()
	b.workload(l, 60, 1, mixed("control", regionNames, allTenants))
	dups, executed, _ := b.oracle(t, l)
	t.Logf("independent stores: %d operations, %d executed once, %d more than once", len(l.bodies), executed, dups)
	if dups == 0 {
		t.Fatal("no key ran twice with independent per-region stores: the oracle cannot tell")
	}
}

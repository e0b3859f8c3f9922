package region

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

const budget = 100 * time.Millisecond

// extension is the shipped max_message_timeout.
const extension = 2500 * time.Millisecond

type counts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counts) add(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[k]++
}

func (c *counts) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k]
}

func (c *counts) HandedOver(from, outcome string) { c.add("handover:" + from + ":" + outcome) }
func (c *counts) Moved(home string)               { c.add("moved:" + home) }
func (c *counts) Quarantined(lost string)         { c.add("quarantined:" + lost) }
func (c *counts) OutOfReach(home string)          { c.add("out_of_reach:" + home) }
func (c *counts) StoreCall(region, op string, err error, _ time.Duration) {
	c.add("call:" + region + ":" + op)
}

// down is a region whose store cannot be reached.
type down struct{ idem.Store }

func (down) Reserve(context.Context, idem.Reservation) (idem.ReserveResult, error) {
	return idem.ReserveResult{}, errors.New("dial tcp: connection refused")
}

type fleet struct {
	stores map[string]Store
	obs    *counts
}

func newFleet(names ...string) *fleet {
	f := &fleet{stores: map[string]Store{}, obs: &counts{}}
	for _, n := range names {
		f.stores[n] = Store{Store: memstore.New(memstore.Options{}), Budget: budget}
	}
	return f
}

// router is region name's server holding homes.
func (f *fleet) router(t *testing.T, name string) *Router {
	t.Helper()
	r, err := NewRouter(name, f.stores, extension, f.obs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func withHomes(h *policy.Homes) *policy.Policy {
	p := policy.Default()
	p.Homes = h
	return p
}

func reserve(t *testing.T, r *Router, p *policy.Policy, scope, key string, fp idem.Fingerprint) (idem.Store, idem.ReserveResult, error) {
	t.Helper()
	st := r.StoreFor(p, scope, key)
	res, err := st.Reserve(context.Background(), idem.Reservation{
		ID: idem.RecordIDFor(p.Name, scope, key), Fingerprint: fp, Token: idem.NewToken(),
		Lease: time.Minute, Retention: p.Retention,
	})
	return st, res, err
}

func TestHomeElsewhereIsOneStoreForEveryRegion(t *testing.T) {
	f := newFleet("eu", "us", "ap")
	p := withHomes(&policy.Homes{Epoch: 1, Default: "eu", Rules: []policy.HomeRule{{Scopes: []string{"acme"}, Region: "us"}}})
	fp := idem.Fingerprint{1}
	// The first attempt enters ap, its retry eu: both ask us.
	st, res, err := reserve(t, f.router(t, "ap"), p, "acme", "k1", fp)
	if err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("first = %v, %v", res.Outcome, err)
	}
	if _, err := f.stores["us"].Get(context.Background(), idem.RecordIDFor(p.Name, "acme", "k1")); err != nil {
		t.Fatalf("the record is not in us: %v", err)
	}
	_, res, err = reserve(t, f.router(t, "eu"), p, "acme", "k1", fp)
	if err != nil || res.Outcome != idem.InFlight {
		t.Fatalf("retry in eu = %v, %v; want in_flight", res.Outcome, err)
	}
	if st.(*attemptStore).pinned.Store != f.stores["us"].Store {
		t.Errorf("the attempt's store is not us")
	}
}

func TestMoveHandsOverEachKey(t *testing.T) {
	f := newFleet("eu", "us")
	old := withHomes(&policy.Homes{Epoch: 1, Default: "eu"})
	moved := withHomes(&policy.Homes{Epoch: 2, Default: "eu", Rules: []policy.HomeRule{
		{Scopes: []string{"acme"}, Region: "us", MovedFrom: "eu", MovedAt: time.Now()}}})
	fp := idem.Fingerprint{1}
	eu, us := f.router(t, "eu"), f.router(t, "us")

	// A key reserved in eu before the move is found there, and completed
	// there by its holder; the new home answers from it.
	ctx := context.Background()
	st, res, err := reserve(t, eu, old, "acme", "before", fp)
	if err != nil || res.Outcome != idem.Reserved {
		t.Fatal(res, err)
	}
	_, res, err = reserve(t, us, moved, "acme", "before", fp)
	if err != nil || res.Outcome != idem.InFlight {
		t.Fatalf("new home while eu's attempt runs = %v, %v; want in_flight", res.Outcome, err)
	}
	id := idem.RecordIDFor(old.Name, "acme", "before")
	rec, _ := f.stores["eu"].Get(ctx, id)
	if err := st.Complete(ctx, id, rec.Token, idem.Response{Status: 201, Body: []byte("made")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	_, res, err = reserve(t, us, moved, "acme", "before", fp)
	if err != nil || res.Outcome != idem.Completed || string(res.Response.Body) != "made" {
		t.Fatalf("new home after eu completed = %+v, %v; want eu's answer", res, err)
	}
	if _, err := f.stores["us"].Get(ctx, id); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("us made a record of a key eu holds: %v", err)
	}

	// A new key: eu gets a tombstone, us the record; a server still on
	// the old map is sent on to us and finds the record there.
	_, res, err = reserve(t, us, moved, "acme", "after", fp)
	if err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("new key at the new home = %v, %v", res.Outcome, err)
	}
	// eu's own store answers at once; the attempt asks the proxy for us's
	// time before it reserves again (attempt.HomeStore).
	st, res, err = reserve(t, eu, old, "acme", "after", fp)
	if err != nil || res.Outcome != idem.Moved || res.Home != "us" {
		t.Fatalf("old map = %v, %v; want moved to us", res.Outcome, err)
	}
	res, err = st.Reserve(ctx, idem.Reservation{ID: idem.RecordIDFor(old.Name, "acme", "after"), Fingerprint: fp,
		Token: idem.NewToken(), Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Outcome != idem.InFlight {
		t.Fatalf("old map, followed = %v, %v; want in_flight from us", res.Outcome, err)
	}
	if f.obs.get("moved:us") != 1 {
		t.Errorf("moved answers = %v", f.obs.m)
	}
	if st.(*attemptStore).home != "us" {
		t.Errorf("the old map's attempt is not pinned to us")
	}
}

func TestLostHomeQuarantinesKeysItMayHaveSeen(t *testing.T) {
	f := newFleet("eu", "us")
	f.stores["ap"] = Store{Store: down{}, Budget: budget}
	failover := time.Now().Add(-time.Hour)
	p := withHomes(&policy.Homes{Epoch: 3, Default: "eu", KeyClockSkew: time.Minute, Rules: []policy.HomeRule{
		{Scopes: []string{"acme"}, Region: "us", MovedFrom: "ap", MovedAt: failover, Lost: true}}})
	us := f.router(t, "us")
	fp := idem.Fingerprint{1}
	for _, key := range []string{
		"order-17", // not a UUIDv7: proves nothing
		uuidv7(failover.Add(-time.Minute)),
		uuidv7(failover.Add(30 * time.Second)),   // within the skew
		uuidv7(time.Now().Add(10 * time.Minute)), // from the future
	} {
		_, res, err := reserve(t, us, p, "acme", key, fp)
		if err != nil || res.Outcome != idem.Unknown {
			t.Errorf("key %s = %v, %v; want unknown (quarantined)", key, res.Outcome, err)
		}
	}
	if n := f.obs.get("quarantined:ap"); n != 4 {
		t.Errorf("quarantined = %d", n)
	}
	key := uuidv7(failover.Add(2 * time.Minute))
	if _, res, err := reserve(t, us, p, "acme", key, fp); err != nil || res.Outcome != idem.Reserved {
		t.Errorf("a key made after the failover = %v, %v; want reserved", res.Outcome, err)
	}
	// A move (not a loss) whose former home is down fails: nothing runs.
	p.Homes.Rules[0].Lost = false
	if _, _, err := reserve(t, us, p, "acme", "order-18", fp); err == nil || !strings.Contains(err.Error(), "hand-over") {
		t.Errorf("moved from a region that cannot be asked: %v", err)
	}
}

func TestUnknownRegionIsRefused(t *testing.T) {
	f := newFleet("eu")
	p := withHomes(&policy.Homes{Epoch: 1, Default: "mars"})
	r := f.router(t, "eu")
	if err := r.Check(p.Homes); err == nil || !strings.Contains(err.Error(), `"mars"`) {
		t.Errorf("Check = %v", err)
	}
	if _, _, err := reserve(t, r, p, "s", "k", idem.Fingerprint{}); !errors.Is(err, idem.ErrRefused) {
		t.Errorf("reserve = %v, want refused", err)
	}
}

func TestUUIDv7Time(t *testing.T) {
	at := time.UnixMilli(1764500000123)
	if ms, ok := uuidv7Time(uuidv7(at)); !ok || ms != at.UnixMilli() {
		t.Errorf("uuidv7Time = %d, %v", ms, ok)
	}
	for _, s := range []string{"", "0190a3b4-5c6d-4e7f-8a9b-0c1d2e3f4a5b" /* v4 */, "0190a3b4-5c6d-7e7f-ca9b-0c1d2e3f4a5b" /* variant */, "0190a3b45c6d7e7f8a9b0c1d2e3f4a5b0000"} {
		if _, ok := uuidv7Time(s); ok {
			t.Errorf("%q read as a UUIDv7", s)
		}
	}
}

func uuidv7(at time.Time) string {
	ms := at.UnixMilli()
	return fmt.Sprintf("%08x-%04x-7abc-8def-0123456789ab", ms>>16, ms&0xffff)
}

// deadlines is a store that records the time each call had left.
type deadlines struct {
	idem.Store
	mu   sync.Mutex
	left []time.Duration
}

func (d *deadlines) record(ctx context.Context) {
	dl, ok := ctx.Deadline()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !ok {
		d.left = append(d.left, -1)
		return
	}
	d.left = append(d.left, time.Until(dl))
}

func (d *deadlines) Reserve(ctx context.Context, rv idem.Reservation) (idem.ReserveResult, error) {
	d.record(ctx)
	return d.Store.Reserve(ctx, rv)
}

func (d *deadlines) Cancel(ctx context.Context, id idem.RecordID, tok idem.Token, hold time.Duration) (idem.CancelResult, error) {
	d.record(ctx)
	return d.Store.Cancel(ctx, id, tok, hold)
}

// TestEveryCallHasItsStoresBudget: whatever sends a call to a store (a
// tombstone followed by a server on the old map, the cancel after it, a
// hand-over), the call gets that store's budget: not the local one of the
// attempt that started at home, nor the longer one of a cancel at the
// stream's end.
func TestEveryCallHasItsStoresBudget(t *testing.T) {
	const far = 550 * time.Millisecond // 100 ms and three round trips of 150 ms
	f := newFleet("eu", "ap")
	us := &deadlines{Store: memstore.New(memstore.Options{})}
	f.stores["us"] = Store{Store: us, Budget: far}
	f.stores["ap"] = Store{Store: f.stores["ap"].Store, Budget: far}
	old := withHomes(&policy.Homes{Epoch: 1, Default: "eu"})
	moved := withHomes(&policy.Homes{Epoch: 2, Default: "eu", Rules: []policy.HomeRule{
		{Scopes: []string{"acme"}, Region: "us", MovedFrom: "eu", MovedAt: time.Now()}}})
	ctx := context.Background()
	rv := func(key string) idem.Reservation {
		return idem.Reservation{ID: idem.RecordIDFor(old.Name, "acme", key), Fingerprint: idem.Fingerprint{1},
			Token: idem.NewToken(), Lease: time.Minute, Retention: time.Hour}
	}
	// A key handed over to us, then asked by eu on the old map (its
	// home is its own store), as the attempt asks: within Budget.
	usr := f.router(t, "us")
	if res, err := usr.StoreFor(moved, "acme", "k").Reserve(ctx, rv("k")); err != nil || res.Outcome != idem.Reserved {
		t.Fatal(res, err)
	}
	st := f.router(t, "eu").StoreFor(old, "acme", "k")
	call := func(op func(context.Context) error) {
		cctx, cancel := context.WithTimeout(ctx, st.Budget())
		defer cancel()
		if err := op(cctx); err != nil {
			t.Fatal(err)
		}
	}
	if st.Budget() != budget {
		t.Fatalf("eu's own home: budget %v, want the local %v", st.Budget(), budget)
	}
	call(func(ctx context.Context) error {
		res, err := st.Reserve(ctx, rv("k"))
		if err == nil && res.Outcome != idem.Moved {
			err = fmt.Errorf("%v, want moved", res.Outcome)
		}
		return err
	})
	if st.Budget() != far {
		t.Fatalf("after the tombstone: budget %v, want us's %v", st.Budget(), far)
	}
	call(func(ctx context.Context) error { _, err := st.Reserve(ctx, rv("k")); return err })
	// The cancel at the stream's end has a longer context: the call to
	// us still gets us's budget.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := st.Cancel(cctx, rv("k").ID, idem.NewToken(), time.Second); err != nil {
		t.Fatal(err)
	}
	// ap on the old map: the home eu is far, and the plan holds a
	// tombstone followed in the same call.
	if _, err := f.router(t, "eu").StoreFor(moved, "acme", "k2").Reserve(ctx, rv("k2")); err != nil {
		t.Fatal(err)
	}
	apst := f.router(t, "ap").StoreFor(old, "acme", "k2")
	if want := budget + far; apst.Budget() != want {
		t.Fatalf("ap's plan %v, want eu's budget and the farthest other's, %v", apst.Budget(), want)
	}
	actx, acancel := context.WithTimeout(ctx, apst.Budget())
	defer acancel()
	if res, err := apst.Reserve(actx, rv("k2")); err != nil || res.Outcome != idem.InFlight {
		t.Fatalf("ap on the old map = %v, %v; want in_flight from us", res.Outcome, err)
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	if len(us.left) != 5 { // us's own write, eu's followed reservation and its cancel, eu's new-map write, ap's followed reservation
		t.Fatalf("calls to us: %v", us.left)
	}
	for i, left := range us.left {
		if left <= budget || left > far {
			t.Errorf("call %d to us had %v left; want us's budget %v", i, left, far)
		}
	}
}

// TestOutOfReachIsRefusedBeforeAnything: a moving scope whose two calls
// cannot fit in what the proxy grants one message is refused before
// either store is asked, and counted.
func TestOutOfReachIsRefusedBeforeAnything(t *testing.T) {
	const far = 1300 * time.Millisecond // 100 ms and three round trips of 400 ms
	f := newFleet("eu")
	f.stores["us"] = Store{Store: memstore.New(memstore.Options{}), Budget: far}
	f.stores["ap"] = Store{Store: memstore.New(memstore.Options{}), Budget: far}
	p := withHomes(&policy.Homes{Epoch: 2, Default: "eu", Rules: []policy.HomeRule{
		{Scopes: []string{"acme"}, Region: "us", MovedFrom: "ap", MovedAt: time.Now()}}})
	_, _, err := reserve(t, f.router(t, "eu"), p, "acme", "k", idem.Fingerprint{1})
	if !errors.Is(err, attempt.ErrHomeOutOfReach) || !errors.Is(err, idem.ErrRefused) {
		t.Fatalf("reserve = %v, want refused, out of reach", err)
	}
	if n := f.obs.get("out_of_reach:us"); n != 1 {
		t.Errorf("out of reach counted %d times", n)
	}
	for _, r := range []string{"us", "ap"} {
		if n := f.obs.get("call:" + r + ":reserve"); n != 0 {
			t.Errorf("%s was asked %d times", r, n)
		}
	}
	if got := f.router(t, "eu").OutOfReach(p.Homes); !slices.Equal(got, []string{"us moved from ap"}) {
		t.Errorf("OutOfReach = %q", got)
	}
	// The same home without the move fits: one call and a tombstone's.
	p.Homes.Rules[0].MovedFrom = ""
	if _, res, err := reserve(t, f.router(t, "eu"), p, "acme", "k", idem.Fingerprint{1}); err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("far home, no move = %v, %v", res.Outcome, err)
	}
}

// TestFutureMoveWaitsForItsTime: a move whose moved_at is still to come
// leaves the scope at its former home until then, with no hand-over.
func TestFutureMoveWaitsForItsTime(t *testing.T) {
	f := newFleet("eu", "us")
	p := withHomes(&policy.Homes{Epoch: 2, Default: "eu", Rules: []policy.HomeRule{
		{Scopes: []string{"acme"}, Region: "us", MovedFrom: "eu", MovedAt: time.Now().Add(time.Hour)}}})
	if _, res, err := reserve(t, f.router(t, "us"), p, "acme", "k", idem.Fingerprint{1}); err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("reserve = %v, %v", res.Outcome, err)
	}
	id := idem.RecordIDFor(p.Name, "acme", "k")
	if rec, err := f.stores["eu"].Get(context.Background(), id); err != nil || rec.State != idem.StateInFlight {
		t.Errorf("the record is not at the former home: %+v, %v", rec, err)
	}
	if n := f.obs.get("handover:eu:handed_over"); n != 0 {
		t.Errorf("handed over %d keys before the move's time", n)
	}
}

// TestMaxRTTIsWherePlansStopFitting: at MaxRTT a home elsewhere, and a
// moving scope, still fit in what the proxy grants; a millisecond more
// and they do not.
func TestMaxRTTIsWherePlansStopFitting(t *testing.T) {
	room := Room(extension, budget)
	for n, c := range map[int]struct{ home, from string }{1: {"us", ""}, 2: {"us", "ap"}} {
		for _, rtt := range []time.Duration{MaxRTT(n, budget, extension), MaxRTT(n, budget, extension) + time.Millisecond} {
			rb := RemoteBudget(budget, rtt)
			plan, _ := Plan(map[string]time.Duration{"eu": budget, "us": rb, "ap": rb}, "eu", c.home, c.from, room)
			if fits := plan <= room; fits != (rtt == MaxRTT(n, budget, extension)) {
				t.Errorf("%d far stores at %v: plan %v, room %v", n, rtt, plan, room)
			}
		}
	}
}

// TestHomeOf names the scope's home under the map in force, and whether it
// is the server's own region (attempt.HomeFinder.HomeOf).
func TestHomeOf(t *testing.T) {
	f := newFleet("eu", "us")
	p := withHomes(&policy.Homes{Epoch: 1, Default: "eu", Rules: []policy.HomeRule{{Scopes: []string{"acme"}, Region: "us"}}})
	eu := f.router(t, "eu")
	if home, here := eu.HomeOf(p, "acme"); home != "us" || here {
		t.Errorf("acme from eu: %q here %v, want us, not here", home, here)
	}
	if home, here := eu.HomeOf(p, "other"); home != "eu" || !here {
		t.Errorf("other from eu: %q here %v, want eu, here", home, here)
	}
}

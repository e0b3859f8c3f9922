package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// PropertyOptions configures RunProperty.
type PropertyOptions struct {
	// Seeds is the number of independent random runs (each its own records),
	// Steps the operations in each. Seed is the first seed; runs use Seed,
	// Seed+1, … so a failure names the seed that reproduces it.
	Seeds, Steps int
	Seed         uint64
	// Clock is the store's clock when the test controls it (the in-memory
	// store): lease expiry is then exact. Without one the store keeps real
	// time (Redis TIME): leases are short, expiry is a sleep, and the model
	// accepts either answer when an operation falls near a lease's end.
	Clock *FakeClock
}

// FakeClock is a clock a test moves by hand.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock starts a clock at a fixed instant.
func NewFakeClock() *FakeClock { return &FakeClock{now: time.Unix(1_700_000_000, 0)} }

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// RunProperty drives random interleavings of Reserve, Renew, Complete,
// Release, MarkUnknown, Cancel and lease expiry from many attempts (tokens) over a
// few records, and checks every answer and every record against a simple
// model written from the contract (docs/design.md §2-§3), independent of package
// idem's transition functions.
func RunProperty(t *testing.T, newStore NewStore, opts PropertyOptions) {
	if opts.Seeds <= 0 {
		opts.Seeds = 1
	}
	if opts.Steps <= 0 {
		opts.Steps = 200
	}
	for i := range opts.Seeds {
		seed := opts.Seed + uint64(i)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			if opts.Clock == nil {
				// In real time runs may overlap; a shared hand-moved clock
				// must not move under another run's feet.
				t.Parallel()
			}
			m := newMachine(t, newStore(t), seed, opts.Clock)
			for step := range opts.Steps {
				m.step(step)
			}
			for _, id := range m.ids {
				m.checkGet(id, "final")
			}
			t.Logf("seed %d: %d steps, outcomes %v", seed, opts.Steps, m.seen)
		})
	}
}

const (
	propShortLease = 40 * time.Millisecond
	propLongLease  = time.Hour
	// clockSlack covers Redis's millisecond clock and rounding.
	clockSlack = 3 * time.Millisecond
)

// modelRecord is the model's idea of a stored record.
type modelRecord struct {
	state    idem.State
	fp       idem.Fingerprint
	tok      idem.Token
	attempts int
	resp     *idem.Response
	// The store's lease end lies within [leaseLo, leaseHi]: the operation
	// that set it ran somewhere in that span, plus the lease.
	leaseLo, leaseHi time.Time
}

type machine struct {
	t      *testing.T
	s      idem.Store
	rng    *rand.Rand
	clock  *FakeClock
	seed   uint64
	ids    []idem.RecordID
	tokens map[idem.RecordID][]idem.Token
	model  map[idem.RecordID]*modelRecord
	// cancelled holds the tokens cancelled per record: the model's holds
	// outlast the run.
	cancelled map[idem.RecordID]map[idem.Token]bool
	log       []string
	// seen counts what the run exercised, for the log.
	seen map[string]int
}

func newMachine(t *testing.T, s idem.Store, seed uint64, clock *FakeClock) *machine {
	m := &machine{t: t, s: s, rng: rand.New(rand.NewPCG(seed, 0x1de)), clock: clock, seed: seed,
		tokens: map[idem.RecordID][]idem.Token{}, model: map[idem.RecordID]*modelRecord{}, seen: map[string]int{},
		cancelled: map[idem.RecordID]map[idem.Token]bool{}}
	for range 3 {
		m.ids = append(m.ids, m.newID())
	}
	return m
}

// newID starts a record nobody used, with a pool of attempts' tokens.
func (m *machine) newID() idem.RecordID {
	id := idem.RecordIDFor("property", idem.NewToken().String(), "key")
	for range 3 {
		m.tokens[id] = append(m.tokens[id], idem.NewToken())
	}
	return id
}

func (m *machine) now() time.Time {
	if m.clock != nil {
		return m.clock.Now()
	}
	return time.Now()
}

func (m *machine) fail(format string, args ...any) {
	m.t.Helper()
	tail := m.log
	if len(tail) > 15 {
		tail = tail[len(tail)-15:]
	}
	m.t.Fatalf("seed %d: %s\nlast operations:\n  %s", m.seed, fmt.Sprintf(format, args...), joinLines(tail))
}

func joinLines(s []string) string {
	var b bytes.Buffer
	for i, l := range s {
		if i > 0 {
			b.WriteString("\n  ")
		}
		b.WriteString(l)
	}
	return b.String()
}

func (m *machine) pickToken(id idem.RecordID) (idem.Token, string) {
	switch r := m.rng.IntN(20); {
	case r < 3:
		return idem.NewToken(), "fresh"
	case r < 11:
		if cur := m.model[id]; cur != nil {
			return cur.tok, "holder"
		}
	}
	i := m.rng.IntN(len(m.tokens[id]))
	return m.tokens[id][i], fmt.Sprintf("t%d", i)
}

func (m *machine) pickLease() time.Duration {
	if m.rng.IntN(3) == 0 {
		return propShortLease
	}
	return propLongLease
}

func (m *machine) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

func (m *machine) step(n int) {
	m.t.Helper()
	i := m.rng.IntN(len(m.ids))
	id := m.ids[i]
	if cur := m.model[id]; cur != nil && cur.state != idem.StateInFlight && m.rng.IntN(8) == 0 {
		// Settled records stay settled: move on to a fresh key now and
		// then, so the early states keep being exercised.
		m.checkGet(id, "retired")
		m.ids[i] = m.newID()
		return
	}
	switch r := m.rng.IntN(100); {
	case r < 35:
		m.reserve(id)
	case r < 45:
		m.renew(id)
	case r < 58:
		m.complete(id)
	case r < 66:
		m.release(id)
	case r < 74:
		m.markUnknown(id)
	case r < 80:
		m.cancel(id)
	case r < 87:
		m.expire()
	default:
		m.checkGet(id, fmt.Sprintf("step %d", n))
	}
}

// errClass names the errors the contract distinguishes.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, idem.ErrNotFound):
		return "not_found"
	case errors.Is(err, idem.ErrNotHolder):
		return "not_holder"
	case errors.Is(err, idem.ErrCancelled):
		return "cancelled"
	}
	return "error: " + err.Error()
}

func (m *machine) reserve(id idem.RecordID) {
	m.t.Helper()
	fp := fpA
	if m.rng.IntN(7) == 0 {
		fp = fpB
	}
	tok, tokName := m.pickToken(id)
	lease := m.pickLease()
	expiry := idem.LeaseExpiryUnknown
	if m.rng.IntN(4) == 0 {
		expiry = idem.LeaseExpiryReexecute
	}
	ctx, cancel := m.ctx()
	defer cancel()
	lo := m.now()
	res, err := m.s.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: fp, Token: tok, Lease: lease,
		Retention: time.Hour, LeaseExpiry: expiry})
	hi := m.now()
	m.log = append(m.log, fmt.Sprintf("reserve(%s, fp%d, %s, %v, expiry=%d) = %v attempt %d, %s",
		id[:6], fp[0], tokName, lease, expiry, res.Outcome, res.Attempt, errClass(err)))
	if m.cancelled[id][tok] {
		// Cancelled: refused, whatever the record.
		m.seen["reserve:cancelled"]++
		if !errors.Is(err, idem.ErrCancelled) {
			m.fail("Reserve by a cancelled token = %v attempt %d, %s; model says cancelled", res.Outcome, res.Attempt, errClass(err))
		}
		return
	}
	if err != nil {
		m.fail("Reserve: %v", err)
	}
	m.seen["reserve:"+res.Outcome.String()]++
	cur := m.model[id]
	want := func(o idem.Outcome, attempt int) {
		m.t.Helper()
		if res.Outcome != o || res.Attempt != attempt {
			m.fail("Reserve = %v attempt %d, model says %v attempt %d", res.Outcome, res.Attempt, o, attempt)
		}
	}
	switch {
	case cur == nil:
		want(idem.Reserved, 1)
		m.model[id] = &modelRecord{state: idem.StateInFlight, fp: fp, tok: tok, attempts: 1,
			leaseLo: lo.Add(lease), leaseHi: hi.Add(lease)}
		m.remember(id, tok)
	case cur.fp != fp:
		want(idem.Mismatch, 0)
	case cur.state == idem.StateInFlight && cur.tok == tok:
		want(idem.Reserved, cur.attempts) // the same attempt again; nothing changes
	case cur.state == idem.StateCompleted:
		cur.attempts++
		want(idem.Completed, cur.attempts)
		if !sameResponse(res.Response, cur.resp) {
			m.fail("replayed %+v, stored %+v", res.Response, cur.resp)
		}
	case cur.state == idem.StateUnknown:
		cur.attempts++
		want(idem.Unknown, cur.attempts)
	default: // in flight under another token: the lease decides
		cur.attempts++
		live := hi.Add(clockSlack).Before(cur.leaseLo)
		expired := !lo.Add(-clockSlack).Before(cur.leaseHi)
		if m.clock != nil {
			live, expired = lo.Before(cur.leaseLo), !lo.Before(cur.leaseLo)
		}
		expiredOutcome := idem.Unknown
		if expiry == idem.LeaseExpiryReexecute {
			expiredOutcome = idem.Reserved
		}
		switch {
		case live:
			want(idem.InFlight, cur.attempts)
		case expired:
			want(expiredOutcome, cur.attempts)
		case res.Outcome != idem.InFlight && res.Outcome != expiredOutcome:
			m.fail("Reserve near the lease's end = %v, model accepts %v or %v", res.Outcome, idem.InFlight, expiredOutcome)
		default:
			want(res.Outcome, cur.attempts) // either side of the boundary
		}
		m.seen["lease:"+res.Outcome.String()]++
		switch res.Outcome {
		case idem.Reserved: // taken over
			cur.tok = tok
			cur.leaseLo, cur.leaseHi = lo.Add(lease), hi.Add(lease)
			m.remember(id, tok)
		case idem.Unknown:
			cur.state = idem.StateUnknown
		}
	}
}

// remember adds a fresh token to the id's pool, so later steps use it.
func (m *machine) remember(id idem.RecordID, tok idem.Token) {
	for _, t := range m.tokens[id] {
		if t == tok {
			return
		}
	}
	m.tokens[id] = append(m.tokens[id], tok)
}

// holderErr is the model's answer for a token-checked transition.
func (m *machine) holderErr(cur *modelRecord, tok idem.Token) string {
	if cur == nil {
		return "not_found"
	}
	if cur.tok != tok {
		return "not_holder"
	}
	return ""
}

func (m *machine) renew(id idem.RecordID) {
	m.t.Helper()
	tok, tokName := m.pickToken(id)
	lease := m.pickLease()
	ctx, cancel := m.ctx()
	defer cancel()
	lo := m.now()
	err := m.s.Renew(ctx, id, tok, lease)
	hi := m.now()
	m.log = append(m.log, fmt.Sprintf("renew(%s, %s, %v) = %s", id[:6], tokName, lease, errClass(err)))
	cur := m.model[id]
	want := m.holderErr(cur, tok)
	if want == "" && cur.state != idem.StateInFlight {
		want = "not_holder"
	}
	if want == "" {
		want = "ok"
		cur.leaseLo, cur.leaseHi = lo.Add(lease), hi.Add(lease)
	}
	m.seen["renew:"+want]++
	if got := errClass(err); got != want {
		m.fail("Renew = %s, model says %s", got, want)
	}
}

func (m *machine) complete(id idem.RecordID) {
	m.t.Helper()
	tok, tokName := m.pickToken(id)
	resp := m.randomResponse()
	ctx, cancel := m.ctx()
	defer cancel()
	err := m.s.Complete(ctx, id, tok, resp, time.Hour)
	m.log = append(m.log, fmt.Sprintf("complete(%s, %s, %d) = %s", id[:6], tokName, resp.Status, errClass(err)))
	cur := m.model[id]
	want := m.holderErr(cur, tok)
	if want == "" {
		want = "ok"
		if cur.state != idem.StateCompleted { // a repeated completion keeps the first
			cur.state, cur.resp = idem.StateCompleted, &resp
		}
	}
	m.seen["complete:"+want]++
	if got := errClass(err); got != want {
		m.fail("Complete = %s, model says %s", got, want)
	}
}

func (m *machine) release(id idem.RecordID) {
	m.t.Helper()
	tok, tokName := m.pickToken(id)
	ctx, cancel := m.ctx()
	defer cancel()
	err := m.s.Release(ctx, id, tok)
	m.log = append(m.log, fmt.Sprintf("release(%s, %s) = %s", id[:6], tokName, errClass(err)))
	cur := m.model[id]
	want := m.holderErr(cur, tok)
	if want == "" && cur.state == idem.StateCompleted {
		want = "not_holder"
	}
	if want == "" {
		want = "ok"
		delete(m.model, id)
	}
	m.seen["release:"+want]++
	if got := errClass(err); got != want {
		m.fail("Release = %s, model says %s", got, want)
	}
}

func (m *machine) markUnknown(id idem.RecordID) {
	m.t.Helper()
	tok, tokName := m.pickToken(id)
	ctx, cancel := m.ctx()
	defer cancel()
	err := m.s.MarkUnknown(ctx, id, tok, time.Hour)
	m.log = append(m.log, fmt.Sprintf("mark_unknown(%s, %s) = %s", id[:6], tokName, errClass(err)))
	cur := m.model[id]
	want := m.holderErr(cur, tok)
	if want == "" && cur.state == idem.StateCompleted {
		want = "not_holder"
	}
	if want == "" {
		want = "ok"
		cur.state = idem.StateUnknown
	}
	m.seen["markunknown:"+want]++
	if got := errClass(err); got != want {
		m.fail("MarkUnknown = %s, model says %s", got, want)
	}
}

// cancel undoes the token's reservation: its record, unless completed, is
// deleted; the token's later reservations are refused.
func (m *machine) cancel(id idem.RecordID) {
	m.t.Helper()
	tok, tokName := m.pickToken(id)
	ctx, cancel := m.ctx()
	defer cancel()
	res, err := m.s.Cancel(ctx, id, tok, time.Hour)
	m.log = append(m.log, fmt.Sprintf("cancel(%s, %s) = %v, %s", id[:6], tokName, res, errClass(err)))
	if err != nil {
		m.fail("Cancel: %v", err)
	}
	want := idem.CancelNotHeld
	if cur := m.model[id]; cur != nil && cur.tok == tok && cur.state != idem.StateCompleted {
		want = idem.CancelReleased
		delete(m.model, id)
	}
	if m.cancelled[id] == nil {
		m.cancelled[id] = map[idem.Token]bool{}
	}
	m.cancelled[id][tok] = true
	m.seen["cancel:"+want.String()]++
	if res != want {
		m.fail("Cancel = %v, model says %v", res, want)
	}
}

// expire lets every short lease run out.
func (m *machine) expire() {
	m.log = append(m.log, "expire")
	if m.clock != nil {
		m.clock.Advance(propShortLease + time.Millisecond)
		return
	}
	var last time.Time
	for _, r := range m.model {
		if r.state == idem.StateInFlight && time.Until(r.leaseHi) < propShortLease*2 && r.leaseHi.After(last) {
			last = r.leaseHi
		}
	}
	if d := time.Until(last.Add(clockSlack)); d > 0 {
		time.Sleep(d)
	}
}

func (m *machine) checkGet(id idem.RecordID, when string) {
	m.t.Helper()
	ctx, cancel := m.ctx()
	defer cancel()
	rec, err := m.s.Get(ctx, id)
	m.log = append(m.log, fmt.Sprintf("get(%s) = %v attempts %d, %s", id[:6], rec.State, rec.Attempts, errClass(err)))
	cur := m.model[id]
	if cur == nil {
		if !errors.Is(err, idem.ErrNotFound) {
			m.fail("%s: Get = %v, %v; model has no record", when, rec.State, err)
		}
		return
	}
	if err != nil {
		m.fail("%s: Get: %v", when, err)
	}
	if rec.State != cur.state || rec.Fingerprint != cur.fp || rec.Token != cur.tok || rec.Attempts != cur.attempts {
		m.fail("%s: record %v fp%d attempts %d, model %v fp%d attempts %d (token match %v)",
			when, rec.State, rec.Fingerprint[0], rec.Attempts, cur.state, cur.fp[0], cur.attempts, rec.Token == cur.tok)
	}
	switch cur.state {
	case idem.StateCompleted:
		if !sameResponse(rec.Response, cur.resp) {
			m.fail("%s: stored %+v, model %+v", when, rec.Response, cur.resp)
		}
	case idem.StateInFlight:
		slack := clockSlack
		if m.clock != nil {
			slack = 0
		}
		if rec.LeaseUntil.Before(cur.leaseLo.Add(-slack)) || rec.LeaseUntil.After(cur.leaseHi.Add(slack)) {
			m.fail("%s: lease until %v, model [%v, %v]", when, rec.LeaseUntil, cur.leaseLo, cur.leaseHi)
		}
	}
}

func (m *machine) randomResponse() idem.Response {
	r := idem.Response{Status: []int{200, 201, 202, 400, 500}[m.rng.IntN(5)]}
	for i := range m.rng.IntN(4) {
		r.Headers = append(r.Headers, idem.Header{Name: fmt.Sprintf("x-h%d", i%2), Value: fmt.Sprint(m.rng.Uint32())})
	}
	switch m.rng.IntN(4) {
	case 0: // empty body
	case 1:
		r.BodyOmitted = true
	default:
		b := make([]byte, m.rng.IntN(64)+1)
		for i := range b {
			b[i] = byte(m.rng.UintN(256))
		}
		r.Body = b
	}
	return r
}

func sameResponse(a, b *idem.Response) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Status != b.Status || a.BodyOmitted != b.BodyOmitted || !bytes.Equal(a.Body, b.Body) || len(a.Headers) != len(b.Headers) {
		return false
	}
	for i := range a.Headers {
		if a.Headers[i] != b.Headers[i] {
			return false
		}
	}
	return true
}

// Package region keeps one uniqueness scope across regions: each scope has
// a home region whose store arbitrates all its keys (policy.Homes), and a
// server in any region calls that store for the keys of that scope. A
// scope moved from one home to another is handed over key by key
// (idem.Reservation.HandOverTo), so that no key is ever reserved in two
// stores; a home declared lost quarantines the keys it may have seen.
// docs/regions.md says what is promised and what is not.
package region

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Store is one region's store, as this server reaches it.
type Store struct {
	idem.Store
	// Budget bounds each call to it while the proxy waits (Budget).
	Budget time.Duration
}

// Observer counts what crossing regions does. Its region labels are the
// regions' names from the server's configuration.
type Observer interface {
	// HandedOver counts a hand-over asked of from's store, by the
	// outcome it reported ("handed_over", "completed", "error", …).
	HandedOver(from, outcome string)
	// Moved counts a reservation a store answered Moved: this server's
	// map is older than the store's tombstone, which sent it to home.
	Moved(home string)
	// Quarantined counts a key answered as of unknown outcome because the
	// lost region that may have seen it could not be asked.
	Quarantined(lost string)
	// StoreCall times one call to region's store.
	StoreCall(region, op string, err error, d time.Duration)
	// OutOfReach counts a key refused before anything was reserved
	// because the calls to home's store cannot fit in the time the proxy
	// grants one message.
	OutOfReach(home string)
}

// Router finds each scope's home and its store (attempt.HomeFinder).
type Router struct {
	local  string
	stores map[string]Store
	obs    Observer
	now    func() time.Time
	// room is the longest a reservation's calls may take in one message
	// (Room).
	room time.Duration
}

// NewRouter routes keys among stores, the store of every region this
// server knows by name; local is the server's own region. extension is
// the longest the proxy extends one message's timer (Envoy's
// max_message_timeout); a key whose calls cannot fit in it is refused
// before anything is reserved (Room). obs may be nil.
func NewRouter(local string, stores map[string]Store, extension time.Duration, obs Observer) (*Router, error) {
	ls, ok := stores[local]
	if !ok {
		return nil, fmt.Errorf("region: no store for the server's own region %q", local)
	}
	if obs == nil {
		obs = nopObserver{}
	}
	return &Router{local: local, stores: stores, obs: obs, now: time.Now, room: Room(extension, ls.Budget)}, nil
}

// Round trips the budgets of a remote region's calls are made of: the
// call itself, and a connection the client opens for it (TCP's handshake
// and the client's HELLO, one round trip each; TLS adds more, which the
// measured round trip of a TLS store's PING does not show: give such a
// store a larger --store-timeout).
const remoteBudgetRTTs = 3

// RemoteBudget is the budget of each call to a store rtt away: the local
// budget, which covers the work at both ends, plus the round trips a call
// over a fresh connection pays.
func RemoteBudget(local, rtt time.Duration) time.Duration {
	return local + remoteBudgetRTTs*rtt
}

// MaxRTT is the largest round trip to other regions' stores at which a
// first reservation that calls n of them (1 for a home elsewhere, 2 for a
// scope moving between two regions elsewhere) still fits in what the proxy
// grants one message (Room); beyond it, the key is refused.
func MaxRTT(n int, local, extension time.Duration) time.Duration {
	return max(0, (Room(extension, local)-time.Duration(n)*local)/time.Duration(n*remoteBudgetRTTs))
}

// Room is the longest the store calls of one reservation may take in a
// message whose timer the proxy extends to extension: the local budget is
// kept for the server's own work and the reply's way back, since the
// proxy's timer restarts when the ask arrives, before the calls begin
// (attempt.Attempt's extension).
func Room(extension, local time.Duration) time.Duration { return extension - local }

// Plan is the time the calls of a first reservation take at most for a
// scope homed in home, moving from from ("" when it is not moving), with
// the budgets given per region, and whether a tombstone newer than the
// map (a home that moved the key on) is followed in the same message: it
// is for a home elsewhere, when the farthest other store still fits in
// room. A plan over local's budget needs the proxy's extension; over room,
// it cannot be made.
func Plan(budgets map[string]time.Duration, local, home, from string, room time.Duration) (plan time.Duration, follow bool) {
	plan = budgets[home]
	if from != "" {
		// A tombstone at the new home after a hand-over is a map newer
		// than the one that named the former home: refused, not followed.
		return plan + budgets[from], false
	}
	if home == local {
		// The proxy is asked for a tombstone's time once it is found.
		return plan, false
	}
	var farthest time.Duration
	for name, b := range budgets {
		if name != home {
			farthest = max(farthest, b)
		}
	}
	if plan+farthest <= room {
		return plan + farthest, true
	}
	return plan, false
}

// UseLocal replaces the store of the server's own region (by the same
// store wrapped in the server's instrumentation, once it exists). Call it
// before the router is used.
func (r *Router) UseLocal(st idem.Store) {
	r.stores[r.local] = Store{Store: st, Budget: r.stores[r.local].Budget}
}

// Local is the server's own region.
func (r *Router) Local() string { return r.local }

// KeepWarm pings every region's store each period until ctx ends, so
// that the connections a remote store's client keeps stay open and a
// first write does not pay a new connection's round trips, and reports
// each round trip to rtt. Each ping is bounded by its store's budget.
func (r *Router) KeepWarm(ctx context.Context, period time.Duration, rtt func(region string, d time.Duration)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		for name, st := range r.stores {
			pctx, cancel := context.WithTimeout(ctx, st.Budget)
			start := time.Now()
			if err := st.Ping(pctx); err == nil {
				rtt(name, time.Since(start))
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check reports every region homes names that the router has no store
// for, naming the map's field, so a policy file that names one is refused
// before it is used.
func (r *Router) Check(h *policy.Homes) error {
	if h == nil {
		return nil
	}
	var errs []error
	for _, name := range h.Regions() {
		if _, ok := r.stores[name]; !ok {
			errs = append(errs, fmt.Errorf("homes: region %q has no store on this server (known: %s; --region-redis names them)", name, r.names()))
		}
	}
	return errors.Join(errs...)
}

func (r *Router) names() string {
	return strings.Join(slices.Sorted(maps.Keys(r.stores)), ", ")
}

// HomeOf implements attempt.HomeFinder: the region whose store arbitrates
// scope's keys under p now, and whether it is this server's.
func (r *Router) HomeOf(p *policy.Policy, scope string) (string, bool) {
	home := p.Homes.For(p, scope, r.now()).Region
	return home, home == r.local
}

// StoreFor implements attempt.HomeFinder: the store that arbitrates key in
// scope under p, for one attempt.
func (r *Router) StoreFor(p *policy.Policy, scope, key string) attempt.HomeStore {
	now := r.now()
	home := p.Homes.For(p, scope, now)
	local := r.stores[r.local].Budget
	hs, ok := r.stores[home.Region]
	if !ok {
		return refused{fmt.Errorf("region: scope's home %q has no store on this server", home.Region), local}
	}
	// Even a home at this server goes through attemptStore: a tombstone
	// newer than this server's map sends the key on (Reserve).
	a := &attemptStore{r: r, home: home.Region, pinned: hs}
	from := ""
	if home.From != "" && !(home.Lost && newerThan(key, home.Since, p.Homes.KeyClockSkew, now)) {
		fs, ok := r.stores[home.From]
		if !ok {
			return refused{fmt.Errorf("region: former home %q has no store on this server", home.From), local}
		}
		a.from, a.fromName, a.lost = fs, home.From, home.Lost
		from = home.From
	}
	a.plan, a.follow = Plan(r.budgets(), r.local, home.Region, from, r.room)
	if a.plan > local && a.plan > r.room {
		r.obs.OutOfReach(home.Region)
		return refused{fmt.Errorf("%w: its calls to %s take up to %v, and the proxy grants a message %v",
			attempt.ErrHomeOutOfReach, strings.TrimPrefix(from+" and ", " and ")+home.Region, a.plan, r.room+local), local}
	}
	return a
}

// OutOfReach lists the homes of h whose first reservation's calls cannot
// fit in what the proxy grants one message (Plan), each as "home" or
// "home moved from from": a request of their scopes entering this server
// is refused.
func (r *Router) OutOfReach(h *policy.Homes) []string {
	if h == nil {
		return nil
	}
	local, b := r.stores[r.local].Budget, r.budgets()
	var out []string
	check := func(home, from string) {
		if plan, _ := Plan(b, r.local, home, from, r.room); plan > local && plan > r.room {
			s := home
			if from != "" {
				s += " moved from " + from
			}
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	check(h.Default, "")
	for _, rule := range h.Rules {
		check(rule.Region, "")
		if rule.MovedFrom != "" {
			check(rule.Region, rule.MovedFrom)
		}
	}
	return out
}

// budgets is each region's budget, by name.
func (r *Router) budgets() map[string]time.Duration {
	b := make(map[string]time.Duration, len(r.stores))
	for name, st := range r.stores {
		b[name] = st.Budget
	}
	return b
}

// attemptStore is one attempt's view of its key's home: a store in another
// region, or a home that must first hand the key over from its former one.
// Once a reservation found where the record lives, every later call of the
// attempt goes there (pinned), whatever map a reload brings meanwhile.
type attemptStore struct {
	r      *Router
	home   string
	pinned Store
	// plan is the budget of the first reservation's calls (Plan); once
	// one was made, every call has pinned's. follow says a tombstone is
	// followed within the plan; followed, that one was.
	plan             time.Duration
	reserved         bool
	follow, followed bool
	// from is the former home while a move's window lasts (unset once
	// the key is handed over, or when the key proves it is newer than a
	// lost home's failover); lost says it was declared lost.
	from     Store
	fromName string
	lost     bool
}

// Budget implements attempt.HomeStore.
func (s *attemptStore) Budget() time.Duration {
	if s.reserved {
		return s.pinned.Budget
	}
	return s.plan
}

// Reserve hands the key over from its former home first, if it has one:
// a record there is answered from there (and the attempt stays with it);
// only once the former home left a tombstone does the new home reserve.
// A Moved answer (the store's tombstone is newer than this server's map)
// is followed once, to the region it names: at once when the plan made
// room for it, else by answering Moved so that the attempt asks the proxy
// for the new home's time first (attempt.HomeStore) and reserves again.
func (s *attemptStore) Reserve(ctx context.Context, rv idem.Reservation) (idem.ReserveResult, error) {
	if s.from.Store != nil {
		if res, done, err := s.handOver(ctx, rv); done {
			s.reserved = true
			return res, err
		}
	}
	res, err := s.r.reserve(ctx, s.pinned, s.home, "reserve", rv)
	s.reserved = true
	if err != nil || res.Outcome != idem.Moved {
		return res, err
	}
	s.r.obs.Moved(res.Home)
	if s.followed {
		return idem.ReserveResult{}, fmt.Errorf("%w: the key moved on from %q to %q: not followed twice", attempt.ErrHomesDisagree, s.home, res.Home)
	}
	next, ok := s.r.stores[res.Home]
	if !ok || res.Home == s.home {
		return idem.ReserveResult{}, fmt.Errorf("%w: the key moved to %q, which this server cannot follow", attempt.ErrHomesDisagree, res.Home)
	}
	if !s.follow && next.Budget > s.r.room && next.Budget > s.r.stores[s.r.local].Budget {
		s.r.obs.OutOfReach(res.Home)
		return idem.ReserveResult{}, fmt.Errorf("%w: the key moved to %s, whose calls take up to %v, and the proxy grants a message %v",
			attempt.ErrHomeOutOfReach, res.Home, next.Budget, s.r.room+s.r.stores[s.r.local].Budget)
	}
	s.home, s.pinned, s.followed = res.Home, next, true
	if !s.follow {
		return res, nil
	}
	res, err = s.r.reserve(ctx, next, s.home, "reserve", rv)
	if err == nil && res.Outcome == idem.Moved {
		return idem.ReserveResult{}, fmt.Errorf("%w: the key moved on from %q to %q: not followed twice", attempt.ErrHomesDisagree, s.home, res.Home)
	}
	return res, err
}

// handOver asks the former home about the key (Reservation.HandOverTo).
// done is false when it left (or found) its tombstone: the new home may
// reserve; otherwise res and err are the reservation's answer.
func (s *attemptStore) handOver(ctx context.Context, rv idem.Reservation) (res idem.ReserveResult, done bool, err error) {
	rv.HandOverTo = s.home
	res, err = s.r.reserve(ctx, s.from, s.fromName, "handover", rv)
	switch {
	case err != nil && s.lost:
		// The lost region cannot say whether it saw the key: its
		// outcome is unknown, and nothing runs.
		s.r.obs.HandedOver(s.fromName, "error")
		s.r.obs.Quarantined(s.fromName)
		return idem.ReserveResult{Outcome: idem.Unknown}, true, nil
	case err != nil:
		s.r.obs.HandedOver(s.fromName, "error")
		return res, true, fmt.Errorf("region: hand-over from %q: %w", s.fromName, err)
	case res.Outcome == idem.Moved:
		s.r.obs.HandedOver(s.fromName, "moved")
		return idem.ReserveResult{}, true, fmt.Errorf("%w: %q handed the key over to %q already, not to %q",
			attempt.ErrHomesDisagree, s.fromName, res.Home, s.home)
	case res.Outcome != idem.HandedOver:
		// The former home holds the record: it stays the record's store.
		s.r.obs.HandedOver(s.fromName, res.Outcome.String())
		s.pinned, s.from = s.from, Store{}
		return res, true, nil
	}
	s.r.obs.HandedOver(s.fromName, "handed_over")
	s.from = Store{}
	return res, false, nil
}

// reserve makes one timed reservation call on region's store st, within
// its budget.
func (r *Router) reserve(ctx context.Context, st Store, region, op string, rv idem.Reservation) (idem.ReserveResult, error) {
	ctx, cancel := context.WithTimeout(ctx, st.Budget)
	defer cancel()
	start := time.Now()
	res, err := st.Reserve(ctx, rv)
	r.obs.StoreCall(region, op, err, time.Since(start))
	return res, err
}

func (s *attemptStore) Renew(ctx context.Context, id idem.RecordID, tok idem.Token, lease time.Duration) (err error) {
	ctx, done := s.call(ctx, "renew", &err)
	defer done()
	return s.pinned.Renew(ctx, id, tok, lease)
}

func (s *attemptStore) Complete(ctx context.Context, id idem.RecordID, tok idem.Token, resp idem.Response, retention time.Duration) (err error) {
	ctx, done := s.call(ctx, "complete", &err)
	defer done()
	return s.pinned.Complete(ctx, id, tok, resp, retention)
}

func (s *attemptStore) Release(ctx context.Context, id idem.RecordID, tok idem.Token) (err error) {
	ctx, done := s.call(ctx, "release", &err)
	defer done()
	return s.pinned.Release(ctx, id, tok)
}

func (s *attemptStore) MarkUnknown(ctx context.Context, id idem.RecordID, tok idem.Token, retention time.Duration) (err error) {
	ctx, done := s.call(ctx, "mark_unknown", &err)
	defer done()
	return s.pinned.MarkUnknown(ctx, id, tok, retention)
}

// Cancel undoes the attempt's reservation where it may have been made:
// the store it is pinned to. A hand-over reserves nothing, so the former
// home holds nothing of the token's.
func (s *attemptStore) Cancel(ctx context.Context, id idem.RecordID, tok idem.Token, hold time.Duration) (_ idem.CancelResult, err error) {
	ctx, done := s.call(ctx, "cancel", &err)
	defer done()
	return s.pinned.Cancel(ctx, id, tok, hold)
}

func (s *attemptStore) Get(ctx context.Context, id idem.RecordID) (_ idem.Record, err error) {
	ctx, done := s.call(ctx, "get", &err)
	defer done()
	return s.pinned.Get(ctx, id)
}

// call bounds one call to the pinned store by its budget, whatever the
// caller's context allows (a cancel or a settlement retried at the end
// has a longer one), and done reports it to the store's region.
func (s *attemptStore) call(ctx context.Context, op string, err *error) (context.Context, func()) {
	ctx, cancel := context.WithTimeout(ctx, s.pinned.Budget)
	start := time.Now()
	return ctx, func() {
		cancel()
		s.r.obs.StoreCall(s.home, op, *err, time.Since(start))
	}
}

func (s *attemptStore) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.pinned.Budget)
	defer cancel()
	return s.pinned.Ping(ctx)
}

// Watch lets a duplicate wait on the store that holds the record.
func (s *attemptStore) Watch(ctx context.Context, id idem.RecordID) (<-chan struct{}, func(), error) {
	w, ok := s.pinned.Store.(idem.Watcher)
	if !ok {
		return nil, nil, errors.New("region: the record's store cannot watch")
	}
	return w.Watch(ctx, id)
}

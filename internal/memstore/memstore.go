// Package memstore is an idempotency store held in the server's memory.
//
// It is the zero-setup default: right for one replica, for development and
// for tests. Its records die with the process and are not shared between
// replicas, so a fleet of servers must use package redisstore instead.
package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// Now is the store's clock; time.Now when nil. Tests inject one to
	// move leases and retention without sleeping.
	Now func() time.Time
	// SweepEvery is how often expired records are dropped; one minute when
	// zero. Expired records are invisible at once either way.
	SweepEvery time.Duration
	// MaxRecords bounds the records held, so a flood of distinct keys
	// cannot exhaust the process's memory; a new reservation past it fails
	// with ErrFull (the server then answers 503, or passes the request
	// through under fail_open). Zero means DefaultMaxRecords.
	MaxRecords int
}

// DefaultMaxRecords is the record limit when Options.MaxRecords is zero.
const DefaultMaxRecords = 1_000_000

// ErrFull: the store holds MaxRecords live records (or as many cancelled
// tokens). It wraps idem.ErrRefused: the call changed nothing.
var ErrFull = fmt.Errorf("memstore: record limit reached: %w", idem.ErrRefused)

// Store implements idem.Store in memory.
type Store struct {
	now        func() time.Time
	maxRecords int
	lastSweep  time.Time // of an inline sweep, under mu

	mu      sync.Mutex
	records map[idem.RecordID]*entry
	// cancelled holds, until when, the tokens whose reservations were
	// cancelled (Cancel).
	cancelled map[cancelKey]time.Time
	// watchers wait for an in-flight record to settle.
	watchers map[idem.RecordID][]chan struct{}

	stop chan struct{}
	done chan struct{}
}

type cancelKey struct {
	id  idem.RecordID
	tok idem.Token
}

type entry struct {
	rec     idem.Record
	expires time.Time
}

var (
	_ idem.Store   = (*Store)(nil)
	_ idem.Watcher = (*Store)(nil)
	_ idem.Admin   = (*Store)(nil)
)

// New returns an empty store with a background sweeper; Close stops it.
func New(opts Options) *Store {
	s := &Store{
		now:       opts.Now,
		records:   make(map[idem.RecordID]*entry),
		cancelled: make(map[cancelKey]time.Time),
		watchers:  make(map[idem.RecordID][]chan struct{}),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.maxRecords = opts.MaxRecords
	if s.maxRecords <= 0 {
		s.maxRecords = DefaultMaxRecords
	}
	every := opts.SweepEvery
	if every <= 0 {
		every = time.Minute
	}
	go s.sweep(every)
	return s
}

// Close stops the sweeper. The store still answers afterwards.
func (s *Store) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	return nil
}

// Len returns the number of live records.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for _, e := range s.records {
		if now.Before(e.expires) {
			n++
		}
	}
	return n
}

func (s *Store) sweep(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.mu.Lock()
			s.sweepLocked(s.now())
			s.mu.Unlock()
		}
	}
}

func (s *Store) sweepLocked(now time.Time) {
	for id, e := range s.records {
		if !now.Before(e.expires) {
			delete(s.records, id)
		}
	}
	for k, until := range s.cancelled {
		if !now.Before(until) {
			delete(s.cancelled, k)
		}
	}
}

// isCancelled reports whether tok's reservations of id are refused now.
// Callers hold s.mu.
func (s *Store) isCancelled(id idem.RecordID, tok idem.Token, now time.Time) bool {
	until, ok := s.cancelled[cancelKey{id, tok}]
	return ok && now.Before(until)
}

// current returns the live record under id, or nil. Callers hold s.mu.
func (s *Store) current(id idem.RecordID, now time.Time) *idem.Record {
	e, ok := s.records[id]
	if !ok {
		return nil
	}
	if !now.Before(e.expires) {
		delete(s.records, id)
		return nil
	}
	rec := e.rec
	return &rec
}

// apply stores a transition's change and wakes the record's watchers when
// it leaves StateInFlight or changes hands. Callers hold s.mu.
func (s *Store) apply(id idem.RecordID, now time.Time, c idem.Change) {
	if c.Delete || (c.Next != nil && (c.Next.State != idem.StateInFlight || s.holderChanged(id, c.Next))) {
		for _, w := range s.watchers[id] {
			close(w)
		}
		delete(s.watchers, id)
	}
	switch {
	case c.Delete:
		delete(s.records, id)
	case c.Next != nil:
		e, ok := s.records[id]
		if !ok {
			e = &entry{}
			s.records[id] = e
		}
		e.rec = *c.Next
		if c.TTL > 0 {
			e.expires = now.Add(c.TTL)
		}
	}
}

func (s *Store) holderChanged(id idem.RecordID, next *idem.Record) bool {
	e, ok := s.records[id]
	return ok && e.rec.Token != next.Token
}

// Watch implements idem.Watcher.
func (s *Store) Watch(ctx context.Context, id idem.RecordID) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if cur := s.current(id, s.now()); cur == nil || cur.State != idem.StateInFlight {
		close(ch)
		return ch, func() {}, nil
	}
	s.watchers[id] = append(s.watchers[id], ch)
	stop := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		ws := s.watchers[id]
		for i, w := range ws {
			if w == ch {
				s.watchers[id] = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(s.watchers[id]) == 0 {
			delete(s.watchers, id)
		}
	}
	return ch, stop, nil
}

// Reserve implements idem.Store. A call in memory happens at once or not
// at all: its errors are idem.ErrCancelled or wrap idem.ErrRefused.
func (s *Store) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	if err := ctx.Err(); err != nil {
		return idem.ReserveResult{}, fmt.Errorf("memstore: reserve: %w: %w", idem.ErrRefused, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.isCancelled(r.ID, r.Token, now) {
		return idem.ReserveResult{}, fmt.Errorf("memstore: reserve: %w", idem.ErrCancelled)
	}
	cur := s.current(r.ID, now)
	if cur == nil && len(s.records) >= s.maxRecords {
		if s.sweepIfDue(now); len(s.records) >= s.maxRecords {
			return idem.ReserveResult{}, ErrFull
		}
	}
	c, res := idem.ApplyReserve(cur, now, r)
	s.apply(r.ID, now, c)
	return res, nil
}

// Renew implements idem.Store.
func (s *Store) Renew(ctx context.Context, id idem.RecordID, tok idem.Token, lease time.Duration) error {
	return s.transition(ctx, id, func(cur *idem.Record, now time.Time) (idem.Change, error) {
		return idem.ApplyRenew(cur, now, tok, lease)
	})
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, id idem.RecordID, tok idem.Token, resp idem.Response, retention time.Duration) error {
	return s.transition(ctx, id, func(cur *idem.Record, _ time.Time) (idem.Change, error) {
		return idem.ApplyComplete(cur, tok, resp, retention)
	})
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, id idem.RecordID, tok idem.Token) error {
	return s.transition(ctx, id, func(cur *idem.Record, _ time.Time) (idem.Change, error) {
		return idem.ApplyRelease(cur, tok)
	})
}

// MarkUnknown implements idem.Store.
func (s *Store) MarkUnknown(ctx context.Context, id idem.RecordID, tok idem.Token, retention time.Duration) error {
	return s.transition(ctx, id, func(cur *idem.Record, _ time.Time) (idem.Change, error) {
		return idem.ApplyMarkUnknown(cur, tok, retention)
	})
}

// Cancel implements idem.Store. The cancelled tokens are bounded like the
// records: past MaxRecords of them, Cancel fails with ErrFull.
func (s *Store) Cancel(ctx context.Context, id idem.RecordID, tok idem.Token, hold time.Duration) (idem.CancelResult, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k := cancelKey{id, tok}
	if _, ok := s.cancelled[k]; !ok && len(s.cancelled) >= s.maxRecords {
		if s.sweepIfDue(now); len(s.cancelled) >= s.maxRecords {
			return 0, ErrFull
		}
	}
	c, res := idem.ApplyCancel(s.current(id, now), tok)
	s.apply(id, now, c)
	s.cancelled[k] = now.Add(hold)
	return res, nil
}

// sweepIfDue sweeps expired records and cancel marks when the store is
// full: they may be holding the room. It looks at most once a second, so
// that a flood does not turn every call into a full scan.
func (s *Store) sweepIfDue(now time.Time) {
	if now.Sub(s.lastSweep) >= time.Second {
		s.lastSweep = now
		s.sweepLocked(now)
	}
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, id idem.RecordID) (idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.current(id, s.now())
	if cur == nil {
		return idem.Record{}, idem.ErrNotFound
	}
	return *cur, nil
}

// Purge implements idem.Admin.
func (s *Store) Purge(ctx context.Context, id idem.RecordID) error {
	return s.transition(ctx, id, func(cur *idem.Record, _ time.Time) (idem.Change, error) {
		if cur == nil {
			return idem.Change{}, idem.ErrNotFound
		}
		return idem.Change{Delete: true}, nil
	})
}

// Resolve implements idem.Admin.
func (s *Store) Resolve(ctx context.Context, id idem.RecordID, resp *idem.Response, retention time.Duration) error {
	return s.transition(ctx, id, func(cur *idem.Record, _ time.Time) (idem.Change, error) {
		return idem.ApplyResolve(cur, resp, retention)
	})
}

// Ping implements idem.Store; memory always answers.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }

func (s *Store) transition(ctx context.Context, id idem.RecordID, f func(*idem.Record, time.Time) (idem.Change, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	c, err := f(s.current(id, now), now)
	if err != nil {
		return err
	}
	s.apply(id, now, c)
	return nil
}

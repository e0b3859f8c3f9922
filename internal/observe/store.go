package observe

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// Store times and traces every call of the store it wraps. InstrumentStore
// hands it out inside a value that has exactly the optional capabilities
// (idem.Watcher, idem.Admin) of the wrapped store, so a caller's type
// assertion answers for the store behind it.
type Store struct {
	inner idem.Store
	m     *Metrics
	// tracer is nil when tracing is off: no span work at all then.
	tracer trace.Tracer
}

// The wrappers that add a capability the wrapped store has.
type (
	watchingStore struct {
		*Store
		watchOps
	}
	adminStore struct {
		*Store
		adminOps
	}
	watchingAdminStore struct {
		*Store
		watchOps
		adminOps
	}
)

var (
	_ idem.Store   = (*Store)(nil)
	_ idem.Watcher = watchingStore{}
	_ idem.Admin   = adminStore{}
	_ idem.Watcher = watchingAdminStore{}
	_ idem.Admin   = watchingAdminStore{}
)

// InstrumentStore wraps st. A nil tracer provider traces nothing. The
// result implements idem.Watcher and idem.Admin when st does, and only
// then.
func InstrumentStore(st idem.Store, m *Metrics, tp trace.TracerProvider) idem.Store {
	s := &Store{inner: st, m: m}
	if tp != nil {
		s.tracer = tp.Tracer("github.com/idem-extproc/idem-extproc/internal/observe")
	}
	w, watches := st.(idem.Watcher)
	a, admins := st.(idem.Admin)
	switch {
	case watches && admins:
		return watchingAdminStore{s, watchOps{s, w}, adminOps{s, a}}
	case watches:
		return watchingStore{s, watchOps{s, w}}
	case admins:
		return adminStore{s, adminOps{s, a}}
	}
	return s
}

func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, idem.ErrNotFound):
		return "not_found"
	case errors.Is(err, idem.ErrNotHolder):
		return "not_holder"
	case errors.Is(err, idem.ErrNotUnknown):
		return "not_unknown"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}

// failureKind names a failure a store reports as its own making: a reply
// it refused, a call that panicked (redisstore's ReplyRefusedError and
// PanicError), known by their method so that no store is imported here.
func failureKind(err error) string {
	var k interface{ StoreFailure() string }
	if errors.As(err, &k) {
		return k.StoreFailure()
	}
	return ""
}

// begin starts timing one call of op and, with tracing on, its span as a
// child of ctx's; the call's end reports both. The methods below call the
// wrapped store directly between the two rather than through a closure:
// the reservation's path runs deep into the Redis client, and the closure's
// frames were enough to overflow a fresh goroutine stack there, costing a
// stack copy on most requests.
func (s *Store) begin(ctx context.Context, op string) (context.Context, call) {
	c := call{m: s.m, op: op}
	if s.tracer != nil {
		ctx, c.span = s.tracer.Start(ctx, "store."+op, trace.WithSpanKind(trace.SpanKindClient))
	}
	c.start = time.Now()
	return ctx, c
}

// call is one store call being timed.
type call struct {
	m     *Metrics
	op    string
	start time.Time
	span  trace.Span // nil when tracing is off
}

func (c call) end(err error) {
	r := result(err)
	c.m.ObserveStoreCall(c.op, r, time.Since(c.start))
	if err != nil {
		if k := failureKind(err); k != "" {
			c.m.storeFailures.WithLabelValues(k).Inc()
		}
	}
	if c.span == nil {
		return
	}
	c.span.SetAttributes(attribute.String("idem.store.result", r))
	if r == "timeout" || r == "error" {
		c.span.SetStatus(codes.Error, err.Error())
	}
	c.span.End()
}

// Reserve implements idem.Store.
func (s *Store) Reserve(ctx context.Context, r idem.Reservation) (idem.ReserveResult, error) {
	ctx, c := s.begin(ctx, "reserve")
	res, err := s.inner.Reserve(ctx, r)
	c.end(err)
	return res, err
}

// Renew implements idem.Store.
func (s *Store) Renew(ctx context.Context, id idem.RecordID, tok idem.Token, lease time.Duration) error {
	ctx, c := s.begin(ctx, "renew")
	err := s.inner.Renew(ctx, id, tok, lease)
	c.end(err)
	return err
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, id idem.RecordID, tok idem.Token, resp idem.Response, retention time.Duration) error {
	ctx, c := s.begin(ctx, "complete")
	err := s.inner.Complete(ctx, id, tok, resp, retention)
	c.end(err)
	return err
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, id idem.RecordID, tok idem.Token) error {
	ctx, c := s.begin(ctx, "release")
	err := s.inner.Release(ctx, id, tok)
	c.end(err)
	return err
}

// MarkUnknown implements idem.Store.
func (s *Store) MarkUnknown(ctx context.Context, id idem.RecordID, tok idem.Token, retention time.Duration) error {
	ctx, c := s.begin(ctx, "mark_unknown")
	err := s.inner.MarkUnknown(ctx, id, tok, retention)
	c.end(err)
	return err
}

// Cancel implements idem.Store.
func (s *Store) Cancel(ctx context.Context, id idem.RecordID, tok idem.Token, hold time.Duration) (idem.CancelResult, error) {
	ctx, c := s.begin(ctx, "cancel")
	res, err := s.inner.Cancel(ctx, id, tok, hold)
	c.end(err)
	return res, err
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, id idem.RecordID) (idem.Record, error) {
	ctx, c := s.begin(ctx, "get")
	rec, err := s.inner.Get(ctx, id)
	c.end(err)
	return rec, err
}

// Ping implements idem.Store.
func (s *Store) Ping(ctx context.Context) error {
	ctx, c := s.begin(ctx, "ping")
	err := s.inner.Ping(ctx)
	c.end(err)
	return err
}

// watchOps times the Watch calls of a store that has them.
type watchOps struct {
	s *Store
	w idem.Watcher
}

// Watch implements idem.Watcher.
func (o watchOps) Watch(ctx context.Context, id idem.RecordID) (changed <-chan struct{}, stop func(), err error) {
	ctx, c := o.s.begin(ctx, "watch")
	changed, stop, err = o.w.Watch(ctx, id)
	c.end(err)
	return changed, stop, err
}

// adminOps times the admin calls of a store that has them.
type adminOps struct {
	s *Store
	a idem.Admin
}

// Purge implements idem.Admin.
func (o adminOps) Purge(ctx context.Context, id idem.RecordID) error {
	ctx, c := o.s.begin(ctx, "purge")
	err := o.a.Purge(ctx, id)
	c.end(err)
	return err
}

// Resolve implements idem.Admin.
func (o adminOps) Resolve(ctx context.Context, id idem.RecordID, resp *idem.Response, retention time.Duration) error {
	ctx, c := o.s.begin(ctx, "resolve")
	err := o.a.Resolve(ctx, id, resp, retention)
	c.end(err)
	return err
}

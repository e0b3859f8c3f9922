package observe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// Store times and traces every call of the store it wraps. It passes on
// the optional idem.Watcher and idem.Admin capabilities; calling one the
// wrapped store lacks is an error.
type Store struct {
	inner idem.Store
	m     *Metrics
	// tracer is nil when tracing is off: no span work at all then.
	tracer trace.Tracer
}

var (
	_ idem.Store   = (*Store)(nil)
	_ idem.Watcher = (*Store)(nil)
	_ idem.Admin   = (*Store)(nil)
)

// InstrumentStore wraps st. A nil tracer provider traces nothing.
func InstrumentStore(st idem.Store, m *Metrics, tp trace.TracerProvider) *Store {
	s := &Store{inner: st, m: m}
	if tp != nil {
		s.tracer = tp.Tracer("github.com/idem-extproc/idem-extproc/internal/observe")
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

// call times op and traces it as a child span of ctx's.
func (s *Store) call(ctx context.Context, op string, f func(context.Context) error) error {
	if s.tracer == nil {
		start := time.Now()
		err := f(ctx)
		s.m.ObserveStoreCall(op, result(err), time.Since(start))
		return err
	}
	ctx, span := s.tracer.Start(ctx, "store."+op, trace.WithSpanKind(trace.SpanKindClient))
	start := time.Now()
	err := f(ctx)
	r := result(err)
	s.m.ObserveStoreCall(op, r, time.Since(start))
	span.SetAttributes(attribute.String("idem.store.result", r))
	if r == "timeout" || r == "error" {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// Reserve implements idem.Store.
func (s *Store) Reserve(ctx context.Context, r idem.Reservation) (res idem.ReserveResult, err error) {
	err = s.call(ctx, "reserve", func(ctx context.Context) error {
		res, err = s.inner.Reserve(ctx, r)
		return err
	})
	return res, err
}

// Renew implements idem.Store.
func (s *Store) Renew(ctx context.Context, id idem.RecordID, tok idem.Token, lease time.Duration) error {
	return s.call(ctx, "renew", func(ctx context.Context) error { return s.inner.Renew(ctx, id, tok, lease) })
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, id idem.RecordID, tok idem.Token, resp idem.Response, retention time.Duration) error {
	return s.call(ctx, "complete", func(ctx context.Context) error { return s.inner.Complete(ctx, id, tok, resp, retention) })
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, id idem.RecordID, tok idem.Token) error {
	return s.call(ctx, "release", func(ctx context.Context) error { return s.inner.Release(ctx, id, tok) })
}

// MarkUnknown implements idem.Store.
func (s *Store) MarkUnknown(ctx context.Context, id idem.RecordID, tok idem.Token, retention time.Duration) error {
	return s.call(ctx, "mark_unknown", func(ctx context.Context) error { return s.inner.MarkUnknown(ctx, id, tok, retention) })
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, id idem.RecordID) (rec idem.Record, err error) {
	err = s.call(ctx, "get", func(ctx context.Context) error {
		rec, err = s.inner.Get(ctx, id)
		return err
	})
	return rec, err
}

// Ping implements idem.Store.
func (s *Store) Ping(ctx context.Context) error {
	return s.call(ctx, "ping", s.inner.Ping)
}

// Watch implements idem.Watcher.
func (s *Store) Watch(ctx context.Context, id idem.RecordID) (changed <-chan struct{}, stop func(), err error) {
	w, ok := s.inner.(idem.Watcher)
	if !ok {
		return nil, nil, fmt.Errorf("observe: %T cannot watch records", s.inner)
	}
	err = s.call(ctx, "watch", func(ctx context.Context) error {
		changed, stop, err = w.Watch(ctx, id)
		return err
	})
	return changed, stop, err
}

// Purge implements idem.Admin.
func (s *Store) Purge(ctx context.Context, id idem.RecordID) error {
	a, ok := s.inner.(idem.Admin)
	if !ok {
		return fmt.Errorf("observe: %T has no admin operations", s.inner)
	}
	return s.call(ctx, "purge", func(ctx context.Context) error { return a.Purge(ctx, id) })
}

// Resolve implements idem.Admin.
func (s *Store) Resolve(ctx context.Context, id idem.RecordID, resp *idem.Response, retention time.Duration) error {
	a, ok := s.inner.(idem.Admin)
	if !ok {
		return fmt.Errorf("observe: %T has no admin operations", s.inner)
	}
	return s.call(ctx, "resolve", func(ctx context.Context) error { return a.Resolve(ctx, id, resp, retention) })
}

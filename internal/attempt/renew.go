package attempt

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Hold makes the attempt the record's holder once the store reserved it
// for its token, and keeps the lease alive until the attempt settles; base
// carries the stream's span (its cancellation is ignored).
func (a *Attempt) Hold(base context.Context) {
	a.renew = a.startRenewer(base)
}

func (a *Attempt) stopRenewing() {
	if a.renew != nil {
		a.renew.stop()
		a.renew = nil
	}
}

// renewer keeps a reservation's lease alive while its stream is open. It
// renews at half the lease, so short requests never cost a renewal.
type renewer struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// startRenewer renews in the background.
func (a *Attempt) startRenewer(base context.Context) *renewer {
	if base.Done() != nil {
		base = context.WithoutCancel(base)
	}
	s, st, budget, id, tok, lease := a.srv, a.store, a.budget, a.ID, a.Token, a.Policy.Lease
	r := &renewer{}
	every := lease / 2
	tick := func() {
		ctx, cancel := context.WithTimeout(base, budget)
		err := st.Renew(ctx, id, tok, lease)
		cancel()
		next := every
		if err != nil {
			s.Log.Warn("lease renewal failed", slog.String("key_hash", string(id)), slog.String("error", err.Error()))
			if definite(err) {
				return
			}
			// Try again well before the lease runs out.
			next = every / 5
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.stopped {
			r.timer.Reset(next)
		}
	}
	r.mu.Lock()
	r.timer = time.AfterFunc(every, tick)
	r.mu.Unlock()
	return r
}

func (r *renewer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	r.timer.Stop()
}

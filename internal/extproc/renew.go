package extproc

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

func (p *processor) stopRenewing() {
	if p.renew != nil {
		p.renew.stop()
		p.renew = nil
	}
}

// renewer keeps a reservation's lease alive while its stream is open. It
// renews at half the lease, so short requests never cost a renewal.
type renewer struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// startRenewer renews in the background; base carries the stream's span
// (its cancellation is ignored: the renewer is stopped explicitly).
func startRenewer(base context.Context, s *Server, id idem.RecordID, tok idem.Token, lease time.Duration) *renewer {
	if base.Done() != nil {
		base = context.WithoutCancel(base)
	}
	r := &renewer{}
	every := lease / 2
	tick := func() {

		ctx, cancel := context.WithTimeout(base, s.cfg.StoreTimeout)
		err := s.cfg.Store.Renew(ctx, id, tok, lease)
		cancel()
		next := every
		if err != nil {
			s.log.Warn("lease renewal failed", slog.String("key_hash", string(id)), slog.String("error", err.Error()))
			if errors.Is(err, idem.ErrNotHolder) || errors.Is(err, idem.ErrNotFound) {
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

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

var _ idem.Watcher = (*Store)(nil)

// hub multiplexes every watch of a Store over one Redis pub/sub
// connection: one channel per awaited record (named like its key), joined
// while someone waits and left when the last waiter stops.
type hub struct {
	rdb redis.UniversalClient
	log *slog.Logger

	mu        sync.Mutex
	ps        *redis.PubSub
	waiters   map[string][]chan struct{} // channel -> closed on a message
	confirmed map[string]bool
	confirmWt map[string][]chan struct{} // channel -> closed on subscription
	done      chan struct{}
}

func newHub(rdb redis.UniversalClient, log *slog.Logger) *hub {
	return &hub{
		rdb:       rdb,
		log:       log,
		waiters:   map[string][]chan struct{}{},
		confirmed: map[string]bool{},
		confirmWt: map[string][]chan struct{}{},
	}
}

// join adds a waiter on channel and returns a channel closed once the
// subscription is active.
func (h *hub) join(ctx context.Context, channel string, w chan struct{}) (<-chan struct{}, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ps == nil {
		h.ps = h.rdb.Subscribe(context.WithoutCancel(ctx))
		h.done = make(chan struct{})
		go h.receive(h.ps, h.done)
	}
	h.waiters[channel] = append(h.waiters[channel], w)
	active := make(chan struct{})
	if h.confirmed[channel] {
		close(active)
		return active, nil
	}
	first := len(h.confirmWt[channel]) == 0 && len(h.waiters[channel]) == 1
	h.confirmWt[channel] = append(h.confirmWt[channel], active)
	if first {
		if err := h.ps.Subscribe(ctx, channel); err != nil {
			h.removeLocked(channel, w)
			return nil, fmt.Errorf("redisstore: subscribe: %w", err)
		}
	}
	return active, nil
}

// leave removes a waiter; the last one out unsubscribes.
func (h *hub) leave(channel string, w chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(channel, w)
}

func (h *hub) removeLocked(channel string, w chan struct{}) {
	ws := h.waiters[channel]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) > 0 {
		h.waiters[channel] = ws
		return
	}
	delete(h.waiters, channel)
	delete(h.confirmed, channel)
	for _, c := range h.confirmWt[channel] {
		close(c)
	}
	delete(h.confirmWt, channel)
	// Best effort: a failed unsubscribe costs only stray messages, which
	// dispatch drops.
	_ = h.ps.Unsubscribe(context.Background(), channel)
}

// receive reads the subscription's messages on a goroutine of the hub's
// own rather than through PubSub.Channel, whose goroutine belongs to
// go-redis: go-redis makes a message of a reply by asserting its shape
// (pubsub.go newMessage indexes reply[0], reply[1] and reply[2] and
// asserts their types unchecked), so a reply of another shape panics
// there, and only here can that panic be recovered. As go-redis's own
// loop does (pubsub.go channel.initAllChan), an error pauses the loop for
// 100 ms and the next Receive reconnects and subscribes again; a closed
// PubSub ends it. go-redis's loop also pings a silent connection; this
// one relies on TCP keep-alive, which go-redis's dialer turns on
// (options.go NewDialer), to notice a dead one.
func (h *hub) receive(ps *redis.PubSub, done chan struct{}) {
	defer close(done)
	for {
		m, err := h.receiveOne(ps)
		switch {
		case errors.Is(err, redis.ErrClosed):
			return
		case err != nil:
			time.Sleep(100 * time.Millisecond)
		default:
			h.dispatch(m)
		}
	}
}

func (h *hub) receiveOne(ps *redis.PubSub) (m any, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = panicked(h.log, "watch", v)
		}
	}()
	return ps.Receive(context.Background())
}

// dispatch wakes the waiters a message concerns.
func (h *hub) dispatch(m any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch m := m.(type) {
	case *redis.Subscription:
		// Also sent again after go-redis reconnects and resubscribes.
		if m.Kind == "subscribe" && len(h.waiters[m.Channel]) > 0 {
			h.confirmed[m.Channel] = true
			for _, c := range h.confirmWt[m.Channel] {
				close(c)
			}
			delete(h.confirmWt, m.Channel)
		}
	case *redis.Message:
		for _, w := range h.waiters[m.Channel] {
			close(w)
		}
		// The waiters are woken; they stop their watch themselves.
		h.waiters[m.Channel] = nil
	}
}

func (h *hub) close() error {
	h.mu.Lock()
	ps, done := h.ps, h.done
	h.ps = nil
	h.mu.Unlock()
	if ps == nil {
		return nil
	}
	err := ps.Close()
	<-done
	return err
}

// Watch implements idem.Watcher: it subscribes to the record's channel,
// then marks the record as awaited (watch.lua), so the script that settles
// it publishes. A record that is not in flight any more wakes at once.
func (s *Store) Watch(ctx context.Context, id idem.RecordID) (_ <-chan struct{}, _ func(), err error) {
	defer s.recoverCall("watch", &err)
	key := s.Key(id)
	w := make(chan struct{})
	active, err := s.hub.join(ctx, key, w)
	if err != nil {
		return nil, nil, err
	}
	var once sync.Once
	stop := func() { once.Do(func() { s.hub.leave(key, w) }) }
	bctx, cancel := s.bound(ctx)
	defer cancel()
	select {
	case <-active:
	case <-bctx.Done():
		stop()
		return nil, nil, fmt.Errorf("redisstore: watch: subscription not confirmed: %w", bctx.Err())
	}
	state, err := runScript(bctx, s.rdb, s.s.watch, []string{key}).Text()
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("redisstore: watch: %w", err)
	}
	if state != "i" {
		stop()
		done := make(chan struct{})
		close(done)
		return done, func() {}, nil
	}
	return w, stop, nil
}

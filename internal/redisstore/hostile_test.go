package redisstore_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

// storePath is one way a store call reaches Redis, and the commands that
// carry it.
type storePath struct {
	name     string
	commands []string
	call     func(ctx context.Context, s *redisstore.Store) error
	// background: the reply is read by go-redis's own goroutine (a
	// subscription's), whose failure the call sees only as a wait that
	// ends with its budget.
	background bool
}

func storePaths() []storePath {
	scripts := []string{"EVALSHA", "EVAL"}
	transition := func(op func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error) func(context.Context, *redisstore.Store) error {
		return func(ctx context.Context, s *redisstore.Store) error { return op(s, ctx, plainReservation()) }
	}
	return []storePath{
		{"reserve", scripts, func(ctx context.Context, s *redisstore.Store) error {
			_, err := s.Reserve(ctx, plainReservation())
			return err
		}, false},
		{"reserve durable", scripts, func(ctx context.Context, s *redisstore.Store) error {
			_, err := s.Reserve(ctx, durableReservation())
			return err
		}, false},
		{"complete", scripts, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			return s.Complete(ctx, r.ID, r.Token, idem.Response{Status: 201, Body: []byte("{}")}, time.Hour)
		}), false},
		{"renew", scripts, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			return s.Renew(ctx, r.ID, r.Token, time.Minute)
		}), false},
		{"release", scripts, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			return s.Release(ctx, r.ID, r.Token)
		}), false},
		{"mark unknown", scripts, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			return s.MarkUnknown(ctx, r.ID, r.Token, time.Hour)
		}), false},
		{"cancel", scripts, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			_, err := s.Cancel(ctx, r.ID, r.Token, time.Second)
			return err
		}), false},
		{"lookup", []string{"HGETALL", "GET"}, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			_, err := s.Get(ctx, r.ID)
			return err
		}), false},
		{"admin purge", scripts, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			return s.Purge(ctx, r.ID)
		}), false},
		{"admin resolve", scripts, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			return s.Resolve(ctx, r.ID, &idem.Response{Status: 200}, time.Hour)
		}), false},
		{"watch", []string{"SUBSCRIBE", "EVALSHA", "EVAL"}, transition(func(s *redisstore.Store, ctx context.Context, r idem.Reservation) error {
			_, stop, err := s.Watch(ctx, r.ID)
			if stop != nil {
				stop()
			}
			return err
		}), true},
		{"scripts load", []string{"SCRIPT"}, func(ctx context.Context, s *redisstore.Store) error {
			return s.LoadScripts(ctx)
		}, false},
		{"ping", []string{"PING"}, func(ctx context.Context, s *redisstore.Store) error {
			return s.Ping(ctx)
		}, false},
	}
}

// hostileAttack is a reply of a hostile store and what the call must
// then say.
type hostileAttack struct {
	name    string
	attack  redistest.Attack
	refused bool // the guard must refuse it (a ReplyRefusedError)
	// long: the call gets a long budget, as the reply does its harm only
	// when read long enough (without the guard, a nesting a few million
	// deep exhausts the goroutine stack: a fatal error).
	long bool
}

func hostileAttacks() []hostileAttack {
	return []hostileAttack{
		{"bulk of 2^62 bytes", redistest.Attack{Reply: redistest.HugeBulk}, true, false},
		{"array of 2^31 elements", redistest.Attack{Reply: redistest.HugeArray}, true, false},
		{"map of 2^40 entries", redistest.Attack{Reply: []byte("%1099511627776\r\n")}, true, false},
		{"verbatim string of 2^40 bytes", redistest.Attack{Reply: []byte("=1099511627776\r\n")}, true, false},
		{"blob error of 2^40 bytes", redistest.Attack{Reply: []byte("!1099511627776\r\n")}, true, false},
		{"attribute of 2^40 entries", redistest.Attack{Reply: []byte("|1099511627776\r\n")}, true, false},
		// Refused where the client reads that deep; a map's reader, say,
		// gives up at the first element.
		{"endless nesting", redistest.Attack{Reply: redistest.DeepNesting, Repeat: 1 << 25}, false, true},
		{"endless line", redistest.Attack{Reply: redistest.LongLine, Repeat: 1 << 8}, true, false},
		{"drip", redistest.Attack{Reply: []byte("*2\r\n$3\r\nabc\r\n:1\r\n"), Drip: 100 * time.Millisecond}, false, false},
		{"cut mid-reply", redistest.Attack{Reply: []byte("*4\r\n+completed\r\n:1\r\n$100\r\nab"), Cut: true}, false, false},
		{"completed with no record", redistest.Attack{Reply: []byte("*3\r\n+completed\r\n:1\r\n:2\r\n")}, false, false},
		{"moved with no home", redistest.Attack{Reply: []byte("*3\r\n+moved\r\n:1\r\n:2\r\n")}, false, false},
		{"completed record of the wrong type", redistest.Attack{Reply: []byte("*4\r\n+completed\r\n:1\r\n:2\r\n*1\r\n:3\r\n")}, false, false},
		{"map for a number", redistest.Attack{Reply: []byte("%1\r\n+s\r\n*0\r\n")}, false, false},
		{"null", redistest.Attack{Reply: []byte("_\r\n")}, false, false},
		{"empty array", redistest.Attack{Reply: []byte("*0\r\n")}, false, false},
		{"double", redistest.Attack{Reply: []byte(",1.5\r\n")}, false, false},
		{"big number", redistest.Attack{Reply: []byte("(123456789012345678901234567890\r\n")}, false, false},
		{"unknown type", redistest.Attack{Reply: []byte("?5\r\n")}, true, false},
	}
}

// TestHostileStoreFailsTheCallNotTheProcess: whatever a store answers on
// any of the store's paths, the call ends with an error within its
// budget (or, for a well-framed reply of another type, with whatever the
// call makes of it), never with a panic, a fatal error or an allocation
// past the reply bound; and the next call, the attack disarmed, works.
func TestHostileStoreFailsTheCallNotTheProcess(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	h := redistest.NewHostile(t, srv.Addr())
	s := redistest.OpenStore(t, h.URL(), time.Second)
	long := redistest.OpenStore(t, h.URL(), 30*time.Second)
	for _, p := range storePaths() {
		for _, a := range hostileAttacks() {
			t.Run(p.name+"/"+a.name, func(t *testing.T) {
				ctx := context.Background()
				a.attack.Commands = p.commands
				h.SetAttack(a.attack)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				st := s
				switch {
				case p.background:
					// A subscription an attack broke is still being
					// mended: each attack gets a hub of its own.
					st = redistest.OpenStore(t, h.URL(), time.Second)
				case a.long:
					st = long
				}
				err := p.call(ctx, st)
				runtime.ReadMemStats(&after)
				hits := h.Hits()
				h.SetAttack(redistest.Attack{})
				if hits == 0 {
					t.Fatalf("the attack met none of %v (err = %v)", p.commands, err)
				}
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
					t.Errorf("the call allocated %d MiB", grew>>20)
				}
				var refused *redisstore.ReplyRefusedError
				if a.refused && !p.background && !errors.As(err, &refused) {
					t.Errorf("err = %v, want a refused reply", err)
				}
				var panicked *redisstore.PanicError
				if errors.As(err, &panicked) {
					t.Errorf("err = %v: the store's own code panicked on the reply", err)
				}
				if err == nil && strings.HasPrefix(p.name, "reserve") {
					t.Errorf("a reservation took %q for an answer", a.name)
				}
				if err := st.Ping(ctx); err != nil {
					t.Errorf("after the attack: %v", err)
				}
			})
		}
	}
}

// TestHostileSeedsOfSentinelAndCluster: the guard is on every connection
// of a Sentinel or Cluster client too, the sentinels' and the nodes' that
// tell the client its topology: a reply past the bounds to SENTINEL or
// CLUSTER fails the call, not the process.
func TestHostileSeedsOfSentinelAndCluster(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	h := redistest.NewHostile(t, srv.Addr())
	for _, tc := range []struct{ url, command string }{
		{"redis+sentinel://" + h.Addr() + "/primary", "SENTINEL"},
		{"redis+cluster://" + h.Addr(), "CLUSTER"},
	} {
		for _, reply := range [][]byte{redistest.HugeBulk, redistest.HugeArray} {
			t.Run(tc.command+"/"+string(reply[:1]), func(t *testing.T) {
				h.SetAttack(redistest.Attack{Commands: []string{tc.command}, Reply: reply})
				s := redistest.OpenStore(t, tc.url, time.Second)
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				err := s.Ping(context.Background())
				runtime.ReadMemStats(&after)
				if h.Hits() == 0 {
					t.Fatalf("no %s command met the attack (err = %v)", tc.command, err)
				}
				if err == nil {
					t.Error("a client that could not learn its topology answered a ping")
				}
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
					t.Errorf("the call allocated %d MiB", grew>>20)
				}
				var pe *redisstore.PanicError
				if errors.As(err, &pe) {
					t.Errorf("err = %v", err)
				}
			})
		}
	}
}

package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// TestScriptsAfterScriptFlush: a Redis that forgot the scripts (restart,
// failover, SCRIPT FLUSH) answers EVALSHA with NOSCRIPT, and every way
// the store runs a script sends it again whole: a call on its own, a
// durable reservation with its WAIT, Watch, Purge and Resolve (a batch:
// TestBatchAfterScriptFlush). Each call below follows a flush.
func TestScriptsAfterScriptFlush(t *testing.T) {
	primary := redistest.Start(t, redistest.Options{Args: []string{"--repl-diskless-sync-delay", "0"}})
	redistest.Start(t, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())}})
	testwait.Until(t, "the replica is attached", func() bool {
		return primary.Info(context.Background(), "replication", "connected_slaves") == "1"
	})
	s := redistest.OpenStore(t, primary.URL(), 5*time.Second)
	ctx := context.Background()
	flush := func() {
		t.Helper()
		if err := primary.Do(ctx, "SCRIPT", "FLUSH").Err(); err != nil {
			t.Fatal(err)
		}
	}
	noScript := func(what string, err error) {
		t.Helper()
		if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
			t.Fatalf("%s after SCRIPT FLUSH: %v", what, err)
		}
	}

	r := durableReservation(func(r *idem.Reservation) { r.WaitReplicas = 0 })
	flush()
	if res, err := s.Reserve(ctx, r); err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("Reserve after SCRIPT FLUSH = %v, %v", res.Outcome, err)
	}

	// A durable reservation is refused while the replica has not caught
	// up (ErrNotDurable); never with NOSCRIPT.
	testwait.Until(t, "a durable reservation after SCRIPT FLUSH is confirmed", func() bool {
		flush()
		_, err := s.Reserve(ctx, durableReservation(func(r *idem.Reservation) { r.WaitTimeout = time.Second }))
		noScript("durable Reserve", err)
		if err != nil && !errors.Is(err, idem.ErrNotDurable) {
			t.Fatalf("durable Reserve after SCRIPT FLUSH: %v", err)
		}
		return err == nil
	})

	flush()
	_, stop, err := s.Watch(ctx, r.ID)
	noScript("Watch", err)
	if err != nil {
		t.Fatalf("Watch after SCRIPT FLUSH: %v", err)
	}
	stop()

	flush()
	if err := s.Purge(ctx, r.ID); err != nil {
		t.Fatalf("Purge after SCRIPT FLUSH: %v", err)
	}

	u := durableReservation(func(r *idem.Reservation) { r.WaitReplicas = 0 })
	if _, err := s.Reserve(ctx, u); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkUnknown(ctx, u.ID, u.Token, time.Hour); err != nil {
		t.Fatal(err)
	}
	flush()
	if err := s.Resolve(ctx, u.ID, nil, time.Hour); err != nil {
		t.Fatalf("Resolve after SCRIPT FLUSH: %v", err)
	}
}

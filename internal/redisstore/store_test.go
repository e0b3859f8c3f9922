package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/storetest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

func TestContractStandalone(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	// A generous call budget: on a loaded two-core machine running the race
	// detector, 50 concurrent reservations can take longer than the
	// production 100 ms, which is a latency matter, not what this checks.
	storetest.Run(t, func(t *testing.T) idem.Store { return redistest.OpenStore(t, srv.URL(), time.Second) })
}

// TestCluster runs the store on a 3-primary Redis Cluster with one replica
// each: the contract suite (every script routed by its key's slot), the
// state-machine property test, durable reservations, and scripts that
// survive a failover.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, ReplicasPerMaster: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Run("contract", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idem.Store { return redistest.OpenStore(t, c.URL(), time.Second) })
	})
	t.Run("property", func(t *testing.T) {
		storetest.RunProperty(t, func(t *testing.T) idem.Store { return redistest.OpenStore(t, c.URL(), time.Second) },
			storetest.PropertyOptions{Seeds: 2, Steps: 150})
	})
	t.Run("durable reservation", func(t *testing.T) {
		s := redistest.OpenStore(t, c.URL(), 200*time.Millisecond)
		r := durableReservation()
		if res, err := s.Reserve(ctx, r); err != nil || res.Outcome != idem.Reserved {
			t.Fatalf("Reserve = %v, %v", res.Outcome, err)
		}
		// Confirmed means the replica holds it now.
		replica := c.ReplicaOf(ctx, c.MasterFor(ctx, s.Key(r.ID)))
		wantOnReplica(t, replica, s.Key(r.ID), true)
		// With the key's replica hung, the reservation cannot be confirmed.
		r2 := durableReservation()
		replica = c.ReplicaOf(ctx, c.MasterFor(ctx, s.Key(r2.ID)))
		replica.Freeze()
		_, err := s.Reserve(ctx, r2)
		replica.Thaw()
		wantNotDurableAndReleased(t, s, r2, err)
	})
	t.Run("a new client's first call stays within budget", func(t *testing.T) {
		// A cold cluster client loads the slot map first; that too must
		// fit the caller's budget (go-redis's COMMAND-table fetch, which
		// would not, is turned off: see NewClient).
		const budget = 100 * time.Millisecond
		for range 5 {
			s := redistest.OpenStore(t, c.URL(), budget)
			took, late := timed(budget, func() {
				_, _ = s.Reserve(context.Background(), durableReservation(func(r *idem.Reservation) { r.WaitReplicas = 0 }))
			})
			if took > budget+slack(budget)+late {
				t.Fatalf("first Reserve took %v, budget %v (a timer of the budget woke %v late)", took, budget, late)
			}
		}
	})
	t.Run("calls stay within budget with a primary hung", func(t *testing.T) {
		const budget = 150 * time.Millisecond
		s := redistest.OpenStore(t, c.URL(), budget)
		// Hang every node, so whichever slot the record lands on is hung
		// (briefly: well under the node timeout, no failover starts).
		hang := func() {
			for _, n := range c.Nodes {
				n.Freeze()
			}
		}
		resume := func() {
			for _, n := range c.Nodes {
				n.Thaw()
			}
		}
		wantWithinBudget(t, s, budget, hang, resume)
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("scripts survive a failover and a flushed script cache", func(t *testing.T) {
		s := redistest.OpenStore(t, c.URL(), time.Second)
		r := durableReservation()
		r.WaitReplicas = 0
		if _, err := s.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		m := c.MasterFor(ctx, s.Key(r.ID))
		next := c.Failover(ctx, m)
		// The new primary never ran the scripts (Redis does not replicate
		// its script cache): EVALSHA answers NOSCRIPT and the store falls
		// back to EVAL. Flushing makes sure of it.
		if err := next.Do(ctx, "SCRIPT", "FLUSH").Err(); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, func() bool { return s.Renew(ctx, r.ID, r.Token, time.Minute) == nil })
		if err := s.Complete(ctx, r.ID, r.Token, idem.Response{Status: 201, Body: []byte("ok")}, time.Hour); err != nil {
			t.Fatalf("Complete after failover: %v", err)
		}
		r.Token = idem.NewToken()
		res, err := s.Reserve(ctx, r)
		if err != nil || res.Outcome != idem.Completed || string(res.Response.Body) != "ok" {
			t.Fatalf("Reserve after failover = %+v, %v", res, err)
		}
	})
}

// TestSentinel runs the store through Sentinel, with passwords on the data
// nodes and on the Sentinels: the contract suite, durable reservations,
// and scripts after a failover.
func TestSentinel(t *testing.T) {
	g := redistest.StartSentinel(t, redistest.SentinelOptions{Password: "data:pw@1", SentinelPassword: "sentinel-pw"})
	// Generous: a failover on a busy machine waits for Sentinel's own
	// view of the replica to catch up (redistest.SentinelGroup.Failover).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t.Run("contract", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) idem.Store { return redistest.OpenStore(t, g.URL(), time.Second) })
	})
	t.Run("durable reservation", func(t *testing.T) {
		s := redistest.OpenStore(t, g.URL(), 200*time.Millisecond)
		r := durableReservation()
		if res, err := s.Reserve(ctx, r); err != nil || res.Outcome != idem.Reserved {
			t.Fatalf("Reserve = %v, %v", res.Outcome, err)
		}
		replica := g.Other(g.Master(ctx))
		wantOnReplica(t, replica, s.Key(r.ID), false)
		replica.Freeze()
		r2 := durableReservation()
		_, err := s.Reserve(ctx, r2)
		replica.Thaw()
		wantNotDurableAndReleased(t, s, r2, err)
	})
	t.Run("calls stay within budget with the primary hung", func(t *testing.T) {
		const budget = 150 * time.Millisecond
		s := redistest.OpenStore(t, g.URL(), budget)
		m := g.Master(ctx)
		wantWithinBudget(t, s, budget, m.Freeze, m.Thaw)
		g.WaitSynced(ctx)
	})
	t.Run("scripts survive a failover", func(t *testing.T) {
		s := redistest.OpenStore(t, g.URL(), time.Second)
		r := durableReservation()
		if _, err := s.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		next := g.Failover(ctx)
		if err := next.Do(ctx, "SCRIPT", "FLUSH").Err(); err != nil {
			t.Fatal(err)
		}
		g.WaitSynced(ctx)
		testwait.For(t, func() bool {
			return s.Complete(ctx, r.ID, r.Token, idem.Response{Status: 201, Body: []byte("ok")}, time.Hour) == nil
		})
		rec, err := s.Get(ctx, r.ID)
		if err != nil || rec.State != idem.StateCompleted {
			t.Fatalf("record after failover = %v, %v", rec.State, err)
		}
	})
}

// TestDurableWithoutReplicas: a server with no replica can never confirm a
// reservation; it is refused and released, never reported Reserved.
func TestDurableWithoutReplicas(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	// The call's budget leaves room around the reservation's 50 ms WAIT
	// on a busy machine: with 100 ms the call once ran out of time before
	// WAIT answered, a deadline error instead of ErrNotDurable.
	s := redistest.OpenStore(t, srv.URL(), time.Second)
	r := durableReservation()
	_, err := s.Reserve(context.Background(), r)
	wantNotDurableAndReleased(t, s, r, err)
	// A replay or conflict needs no confirmation: it writes nothing the
	// request depends on.
	tok := idem.NewToken()
	plain := r
	plain.WaitReplicas, plain.Token = 0, tok
	if _, err := s.Reserve(context.Background(), plain); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(context.Background(), r.ID, tok, idem.Response{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	res, err := s.Reserve(context.Background(), durableReservation(withID(r.ID)))
	if err != nil || res.Outcome != idem.Completed {
		t.Fatalf("replay with durability = %v, %v", res.Outcome, err)
	}
}

// wantOnReplica checks that a replica holds key right now.
func wantOnReplica(t *testing.T, replica *redistest.Server, key string, cluster bool) {
	t.Helper()
	ctx := context.Background()
	conn := replica.Client().Conn()
	defer conn.Close()
	if cluster {
		if err := conn.ReadOnly(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := conn.Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("the replica does not hold the confirmed reservation: %d, %v", n, err)
	}
}

type reservationOpt func(*idem.Reservation)

func withID(id idem.RecordID) reservationOpt { return func(r *idem.Reservation) { r.ID = id } }

func durableReservation(opts ...reservationOpt) idem.Reservation {
	r := idem.Reservation{
		ID:           idem.RecordIDFor("durable", "scope", idem.NewToken().String()),
		Fingerprint:  idem.Fingerprint{7},
		Token:        idem.NewToken(),
		Lease:        time.Minute,
		Retention:    time.Hour,
		WaitReplicas: 1,
		WaitTimeout:  50 * time.Millisecond,
	}
	for _, o := range opts {
		o(&r)
	}
	return r
}

func wantNotDurableAndReleased(t *testing.T, s *redisstore.Store, r idem.Reservation, err error) {
	t.Helper()
	if !errors.Is(err, idem.ErrNotDurable) {
		t.Fatalf("Reserve error %v, want ErrNotDurable", err)
	}
	testwait.For(t, func() bool {
		_, err := s.Get(context.Background(), r.ID)
		return errors.Is(err, idem.ErrNotFound)
	})
}

// TestPropertyStandalone runs the state-machine property test on one
// server, in real time (Redis judges leases by its own TIME).
func TestPropertyStandalone(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	storetest.RunProperty(t, func(t *testing.T) idem.Store { return redistest.OpenStore(t, srv.URL(), time.Second) },
		storetest.PropertyOptions{Seeds: 4, Steps: 400, Seed: 100})
}

// TestDurableReservationIsOneRoundTrip: the reservation script and its
// WAIT leave together, as one write of the client's, not WAIT a round
// trip after the script's answer: the link between the server and a
// primary with one replica carries one read for the whole call.
func TestDurableReservationIsOneRoundTrip(t *testing.T) {
	primary := redistest.Start(t, redistest.Options{Args: []string{"--repl-diskless-sync-delay", "0"}})
	replica := redistest.Start(t, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.Port())}})
	testwait.Until(t, "the replica is attached", func() bool {
		return primary.Info(context.Background(), "replication", "connected_slaves") == "1"
	})
	link := redistest.NewDelayLink(t, primary.Addr())
	link.SetDelay(5*time.Millisecond, 5*time.Millisecond)
	s := redistest.OpenStore(t, link.URL(), 2*time.Second)
	ctx := context.Background()
	// Connections open, scripts loaded, the replica's first sync done.
	testwait.Until(t, "a durable reservation is confirmed", func() bool {
		_, err := s.Reserve(ctx, durableReservation())
		return err == nil
	})
	before := link.UpReads()
	r := durableReservation()
	if res, err := s.Reserve(ctx, r); err != nil || res.Outcome != idem.Reserved {
		t.Fatalf("Reserve = %v, %v", res.Outcome, err)
	}
	if n := link.UpReads() - before; n != 1 {
		t.Errorf("the durable reservation took %d writes of the client, want 1 (the script and WAIT together)", n)
	}
	wantOnReplica(t, replica, s.Key(r.ID), false)
}

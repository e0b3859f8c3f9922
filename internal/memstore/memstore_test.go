package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/memstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/storetest"
)

func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) idem.Store {
		s := memstore.New(memstore.Options{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestMaxRecords(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := memstore.New(memstore.Options{MaxRecords: 3, Now: func() time.Time { return now }})
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	reserve := func(key string, retention time.Duration) error {
		_, err := s.Reserve(ctx, idem.Reservation{ID: idem.RecordIDFor("p", "s", key), Token: idem.NewToken(),
			Lease: time.Second, Retention: retention})
		return err
	}
	for i := range 3 {
		if err := reserve(fmt.Sprint(i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := reserve("one too many", time.Minute); !errors.Is(err, memstore.ErrFull) || !errors.Is(err, idem.ErrRefused) {
		t.Fatalf("error %v, want ErrFull, which changed nothing (idem.ErrRefused)", err)
	}
	// An existing record is still answered when full.
	if err := reserve("0", time.Minute); err != nil {
		t.Fatalf("a known key must still be answered: %v", err)
	}
	// Once records expire, there is room again.
	now = now.Add(2 * time.Minute)
	if err := reserve("after expiry", time.Minute); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if n := s.Len(); n != 1 {
		t.Fatalf("live records %d, want 1", n)
	}
}

// TestRefusedReserveChangesNothing: a reservation the store did not act
// on says so (idem.ErrRefused), so its attempt has nothing to cancel.
func TestRefusedReserveChangesNothing(t *testing.T) {
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Reserve(ctx, idem.Reservation{ID: "k", Token: idem.NewToken(), Lease: time.Second, Retention: time.Minute})
	if !errors.Is(err, idem.ErrRefused) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want the context's, refused", err)
	}
}

// TestCancelledTokensAreBounded: cancelled tokens are held like records,
// no more of them than MaxRecords, and dropped once their hold ends.
func TestCancelledTokensAreBounded(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := memstore.New(memstore.Options{MaxRecords: 2, Now: func() time.Time { return now }})
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	cancel := func(key string) error {
		_, err := s.Cancel(ctx, idem.RecordIDFor("p", "s", key), idem.NewToken(), time.Minute)
		return err
	}
	for i := range 2 {
		if err := cancel(fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cancel("one too many"); !errors.Is(err, memstore.ErrFull) {
		t.Fatalf("error %v, want ErrFull", err)
	}
	now = now.Add(2 * time.Minute)
	if err := cancel("after their hold"); err != nil {
		t.Fatalf("after the holds ended: %v", err)
	}
}

// TestProperty runs the state-machine property test with the store's clock
// in the test's hands, so lease expiry is exact.
func TestProperty(t *testing.T) {
	clock := storetest.NewFakeClock()
	storetest.RunProperty(t, func(t *testing.T) idem.Store {
		s := memstore.New(memstore.Options{Now: clock.Now})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}, storetest.PropertyOptions{Seeds: 8, Steps: 2000, Clock: clock})
}

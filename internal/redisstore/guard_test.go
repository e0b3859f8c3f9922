package redisstore

import (
	"errors"
	"testing"
)

// TestGuardBudgetIsSharedByTheClientsConnections: what the replies being
// read declare is counted across every connection of a client, so that
// many connections each told of a large reply cannot allocate more
// together than one may; a reply read whole, or a connection closed, gives
// its share back.
func TestGuardBudgetIsSharedByTheClientsConnections(t *testing.T) {
	budget := newReplyBudget(1000)
	a, b := respScanner{budget: budget}, respScanner{budget: budget}
	if err := a.feed([]byte("$600\r\n")); err != nil {
		t.Fatal(err)
	}
	var refused *ReplyRefusedError
	if err := b.feed([]byte("$600\r\n")); !errors.As(err, &refused) {
		t.Fatalf("a second 600-byte reply beside the first: %v, want refused", err)
	}
	if got := budget.inFlight.Load(); got != 602 {
		t.Fatalf("%d bytes held, want the first reply's 602", got)
	}
	// The first reply arrives whole: its share is free again.
	if err := a.feed(make([]byte, 602)); err != nil {
		t.Fatal(err)
	}
	c := respScanner{budget: budget}
	if err := c.feed([]byte("*2\r\n$500\r\n")); err != nil {
		t.Fatalf("after the first reply ended: %v", err)
	}
	c.release() // its connection closed mid-reply
	if got := budget.inFlight.Load(); got != 0 {
		t.Fatalf("%d bytes still held", got)
	}
}

// TestGuardAllocatesNothing: following the framing costs no allocation per
// read.
func TestGuardAllocatesNothing(t *testing.T) {
	s := respScanner{budget: newReplyBudget(0)}
	reply := []byte("*4\r\n+completed\r\n:1\r\n:2\r\n$3\r\nabc\r\n%1\r\n+s\r\n_\r\n")
	if n := testing.AllocsPerRun(100, func() {
		if err := s.feed(reply); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per reply", n)
	}
}

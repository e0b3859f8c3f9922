package extproc

import "testing"

// TestBudgetTellsSmallMessageBodies: a body kept in many small messages
// counts, whole, as small once it has come in smallBodyMessages of them
// (and Config.OnSmallBody is called then, once), and stops counting
// when released; a body in messages of Envoy's usual size, or one in a few
// small messages, never counts.
func TestBudgetTellsSmallMessageBodies(t *testing.T) {
	var told int
	s := New(Config{MaxBufferedBytes: 1 << 30, OnSmallBody: func() { told++ }})
	b := s.budget
	var trickled, sized, short holding
	for i := range smallBodyMessages - 1 {
		if !b.hold(&trickled, 1) || !b.hold(&sized, 16<<10) || (i < 8 && !b.hold(&short, 1)) {
			t.Fatal("the budget refused a byte it had room for")
		}
	}
	if got := b.small.Load(); got != 0 || told != 0 {
		t.Fatalf("after %d messages the budget counts %d small bytes and told of %d small bodies, want 0 and 0",
			smallBodyMessages-1, got, told)
	}
	b.hold(&trickled, 0) // a message that fits the buffer's capacity adds no bytes, but is one more
	b.hold(&sized, 16<<10)
	if got, want := b.small.Load(), trickled.bytes; got != want || want != smallBodyMessages-1 {
		t.Fatalf("small bytes %d, want the trickled body's %d (%d messages)", got, want, trickled.messages)
	}
	b.hold(&trickled, 5)
	if got := b.small.Load(); got != smallBodyMessages-1+5 || told != 1 {
		t.Fatalf("small bytes %d after 5 more, want %d; told of %d small bodies, want 1", got, smallBodyMessages-1+5, told)
	}
	b.release(&trickled)
	if got := b.small.Load(); got != 0 || trickled != (holding{}) {
		t.Fatalf("after release: small %d, holding %+v; want 0 and none", got, trickled)
	}
	b.release(&sized)
	b.release(&short)
	if got := b.used.Load(); got != 0 {
		t.Fatalf("after every release the budget holds %d bytes, want 0", got)
	}
	var none *bodyBudget
	var h holding
	if !none.hold(&h, 1<<20) || h != (holding{}) {
		t.Fatalf("without a budget a hold is free and counts nothing: %+v", h)
	}
	none.release(&h)
}

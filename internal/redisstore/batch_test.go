package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// reads is Redis's count of reads from client sockets (INFO stats
// total_reads_processed, Redis ≥ 6.0): a pipeline of many commands that
// arrive together is one read, a lone command one read each.
func reads(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	n, err := strconv.ParseInt(srv.Info(context.Background(), "stats", "total_reads_processed"), 10, 64)
	if err != nil {
		t.Fatalf("INFO stats total_reads_processed: %v", err)
	}
	return n
}

// evalCalls is how many times Redis ran cmd (INFO commandstats).
func cmdCalls(t *testing.T, srv *redistest.Server, cmd string) int64 {
	t.Helper()
	text := srv.Info(context.Background(), "commandstats", "cmdstat_"+cmd)
	if text == "" {
		return 0
	}
	var n int64
	if _, err := fmt.Sscanf(text, "calls=%d", &n); err != nil {
		t.Fatalf("cmdstat_%s %q: %v", cmd, text, err)
	}
	return n
}

func plainReservation() idem.Reservation {
	return durableReservation(func(r *idem.Reservation) { r.WaitReplicas = 0 })
}

// TestConcurrentCallsAreBatched: script calls of many concurrent streams
// reach Redis in fewer reads than calls, and every one gets its own answer.
func TestConcurrentCallsAreBatched(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := redistest.OpenStore(t, srv.URL(), 5*time.Second)
	const streams, each = 32, 40
	ctx := context.Background()
	// Load the scripts first, so every call below is one EVALSHA.
	r := plainReservation()
	if _, err := s.Reserve(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, r.ID, r.Token, idem.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	readsBefore, callsBefore := reads(t, srv), cmdCalls(t, srv, "evalsha")
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for g := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				r := plainReservation()
				res, err := s.Reserve(ctx, r)
				if err != nil || res.Outcome != idem.Reserved {
					errs <- fmt.Errorf("Reserve = %v, %v", res.Outcome, err)
					return
				}
				body := fmt.Sprintf("%d/%d", g, i)
				if err := s.Complete(ctx, r.ID, r.Token, idem.Response{Status: 201, Body: []byte(body)}, time.Hour); err != nil {
					errs <- err
					return
				}
				// Each caller got its own reply: a replay answers its own body.
				r.Token = idem.NewToken()
				res, err = s.Reserve(ctx, r)
				if err != nil || res.Outcome != idem.Completed || string(res.Response.Body) != body {
					errs <- fmt.Errorf("replay = %v %q, %v; want %q", res.Outcome, res.Response.Body, err, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	calls := cmdCalls(t, srv, "evalsha") - callsBefore
	// Two INFO reads of the probe's are counted too.
	got := reads(t, srv) - readsBefore - 2
	t.Logf("%d script calls in %d reads", calls, got)
	if calls != streams*each*3 {
		t.Fatalf("Redis ran %d EVALSHAs, want %d", calls, streams*each*3)
	}
	if got >= calls*3/4 {
		t.Fatalf("%d script calls took %d reads: not batched", calls, got)
	}
}

// TestShortDeadlineInBatchBehindHungRedis: with Redis hung, a caller whose
// context ends returns at once with the same error as an unbatched call
// (context.DeadlineExceeded, or Canceled), whether its call is still
// queued or already sent in a batch, while the others in its batch keep
// waiting and succeed once Redis answers. A call whose caller left before
// its batch formed is never sent.
func TestShortDeadlineInBatchBehindHungRedis(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := redistest.OpenStore(t, srv.URL(), 10*time.Second)
	ctx := context.Background()
	// Load the script, so the batch below is answered in one go.
	if _, err := s.Reserve(ctx, plainReservation()); err != nil {
		t.Fatal(err)
	}
	reserve := func(ctx context.Context, r idem.Reservation) <-chan error {
		ch := make(chan error, 1)
		go func() {
			res, err := s.Reserve(ctx, r)
			if err == nil && res.Outcome != idem.Reserved {
				err = fmt.Errorf("outcome %v", res.Outcome)
			}
			ch <- err
		}()
		return ch
	}
	waitBatching := func(busy, queued int) {
		t.Helper()
		testwait.Until(t, fmt.Sprintf("%d slots busy, %d calls queued", busy, queued), func() bool {
			b, q := redisstore.Batching(s)
			return b == busy && q == queued
		})
	}
	wantErr := func(what string, ch <-chan error, want error) {
		t.Helper()
		err := <-ch
		if !errors.Is(err, want) || err.Error() != "redisstore: reserve: "+want.Error() {
			t.Fatalf("%s: %v; want redisstore: reserve: %v", what, err, want)
		}
	}
	srv.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	// Every slot is held by a call hung on its own. Slot 0's caller gives
	// up after 2 s (go-redis interrupts a blocked read at the context's
	// deadline, not at its cancellation: the reply is read under a socket
	// deadline taken from the context, redis.go pipelineProcessCmds and
	// baseClient._process, cn.WithReader).
	slot0ctx, cancel0 := context.WithTimeout(ctx, 2*time.Second)
	defer cancel0()
	slot0 := reserve(slot0ctx, plainReservation())
	var slots []<-chan error
	for range redisstore.MaxBatches - 1 {
		slots = append(slots, reserve(ctx, plainReservation()))
	}
	waitBatching(redisstore.MaxBatches, 0)

	// 1. A queued call whose deadline passes returns then, and is not sent.
	queuedShort := plainReservation()
	qctx, qcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer qcancel()
	wantErr("queued call past its deadline", reserve(qctx, queuedShort), context.DeadlineExceeded)

	// 2. A call sent in a batch (in the slot freed by slot 0's caller) whose
	// caller leaves while the batch hangs.
	inBatch, long := plainReservation(), plainReservation()
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	longDone := reserve(ctx, long)
	inBatchDone := reserve(bctx, inBatch)
	waitBatching(redisstore.MaxBatches, 3) // the call that left is still queued
	sent := redisstore.BatchedCalls(s)
	wantErr("slot 0", slot0, context.DeadlineExceeded)
	waitBatching(redisstore.MaxBatches, 0) // the queue left as a batch
	// ...and was handed to Redis (the call that left dropped from it), not
	// only taken off the queue: a caller leaving before that holds its
	// call back, as part 1 shows.
	testwait.Until(t, "the batch of two handed to Redis", func() bool { return redisstore.BatchedCalls(s) == sent+2 })
	bcancel()
	wantErr("call that left its batch", inBatchDone, context.Canceled)
	for _, ch := range append(slots, longDone) {
		select {
		case err := <-ch:
			t.Fatalf("a call answered while Redis hangs: %v", err)
		default:
		}
	}
	srv.Thaw()
	thawed = true
	for _, ch := range append(slots, longDone) {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	exists := func(r idem.Reservation) bool {
		n, err := srv.Client().Exists(ctx, s.Key(r.ID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if exists(queuedShort) {
		t.Error("a call whose caller left before its batch formed was sent")
	}
	if !exists(inBatch) || !exists(long) {
		t.Error("the batch in flight did not reach Redis")
	}
}

// TestBatchAfterScriptFlush: a Redis that forgot the scripts (restart,
// failover, SCRIPT FLUSH) answers a batch's EVALSHAs with NOSCRIPT; the
// batch falls back to EVAL for them, as a lone call does.
func TestBatchAfterScriptFlush(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := redistest.OpenStore(t, srv.URL(), 10*time.Second)
	ctx := context.Background()
	held := make([]idem.Reservation, redisstore.MaxBatches)
	for i := range held {
		held[i] = plainReservation()
		if _, err := s.Reserve(ctx, held[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Do(ctx, "SCRIPT", "FLUSH").Err(); err != nil {
		t.Fatal(err)
	}
	evalsBefore := cmdCalls(t, srv, "eval")
	srv.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	done := make(chan error, 16)
	// The slots are held by renewals (another script, so their own EVAL
	// does not load the one the batch runs).
	for _, r := range held {
		go func() { done <- s.Renew(ctx, r.ID, r.Token, time.Minute) }()
	}
	testwait.For(t, func() bool { b, _ := redisstore.Batching(s); return b == redisstore.MaxBatches })
	const queued = 5
	for range queued {
		go func() {
			res, err := s.Reserve(ctx, plainReservation())
			if err == nil && res.Outcome != idem.Reserved {
				err = fmt.Errorf("outcome %v", res.Outcome)
			}
			done <- err
		}()
	}
	testwait.For(t, func() bool { _, q := redisstore.Batching(s); return q == queued })
	srv.Thaw()
	thawed = true
	for range redisstore.MaxBatches + queued {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Each batched reservation was answered NOSCRIPT and sent again as EVAL
	// (an error above otherwise); the renewals add one EVAL each, or one in
	// all when the second's EVALSHA reached Redis after the first's EVAL had
	// loaded the script.
	if n := cmdCalls(t, srv, "eval") - evalsBefore; n < queued+1 || n > queued+redisstore.MaxBatches {
		t.Fatalf("%d EVALs, want %d batched reservations and 1 to %d renewals", n, queued, redisstore.MaxBatches)
	}
}

// TestBatchSlotsOption: Options.BatchSlots sets how many calls run at
// once before the next ones queue for a batch. With Redis hung, five
// slots hold five calls on their own and the sixth waits in the queue;
// once Redis answers, every call gets its reply.
func TestBatchSlotsOption(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	rdb, err := redisstore.NewClient(srv.URL(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const slots = 5
	s := redisstore.New(rdb, redisstore.Options{CallTimeout: 10 * time.Second, BatchSlots: slots})
	t.Cleanup(func() {
		_ = s.Close()
		_ = rdb.Close()
	})
	ctx := context.Background()
	if _, err := s.Reserve(ctx, plainReservation()); err != nil { // loads the script
		t.Fatal(err)
	}
	srv.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	var done []chan error
	call := func() {
		ch := make(chan error, 1)
		go func() {
			res, err := s.Reserve(ctx, plainReservation())
			if err == nil && res.Outcome != idem.Reserved {
				err = fmt.Errorf("outcome %v", res.Outcome)
			}
			ch <- err
		}()
		done = append(done, ch)
	}
	for range slots {
		call()
	}
	testwait.Until(t, "every slot busy, none queued", func() bool {
		b, q := redisstore.Batching(s)
		return b == slots && q == 0
	})
	call()
	testwait.Until(t, "one call queued behind the busy slots", func() bool {
		b, q := redisstore.Batching(s)
		return b == slots && q == 1
	})
	srv.Thaw()
	thawed = true
	for _, ch := range done {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
}

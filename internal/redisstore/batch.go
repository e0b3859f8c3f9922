package redisstore

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultBatchSlots bounds the batches in flight at once to one Redis
// node, each on a pooled connection of its own, unless Options.BatchSlots
// says otherwise. While they are all out, new calls queue and leave
// together in the next batch: one write and one read for all of them
// instead of one each. Chosen on loopback by BenchmarkConcurrentScripts
// (docs/redis.md, "Pipelining"); a Redis further away keeps each batch out
// longer, and more slots let more of them overlap (the benchmark's rtt
// variants measure it through a delay link).
const DefaultBatchSlots = 2

// BatchedUpTo is the round trip to a Redis up to which batching its calls
// pays. Measured through the delay link (BenchmarkScriptsOverDelay, 32
// streams, docs/redis.md "Pipelining"): with the link alone the batcher
// with DefaultBatchSlots did 21 900 first writes per second against 12 100
// unbatched; at 0.5 ms and beyond unbatched calls did best (8 200 against
// 3 600 at 0.5 ms, 5 500 against 3 400 at 1 ms), because a call that waits
// for a slot waits a round trip. Loopback to a local redis-server is tens
// of microseconds.
const BatchedUpTo = 250 * time.Microsecond

// BatchingFor says how to batch the calls to a Redis rtt away (measured;
// zero when unknown): DefaultBatchSlots up to BatchedUpTo, unbatched
// beyond it.
func BatchingFor(rtt time.Duration) Options {
	if rtt > BatchedUpTo {
		return Options{Unbatched: true}
	}
	return Options{BatchSlots: DefaultBatchSlots}
}

// batcher writes script calls of concurrent callers to Redis together
// (pipelining), never waiting for a timer:
//
//   - a call that finds no batch queued and a batch slot free runs on its
//     own, right away, on the caller's goroutine and context, exactly as an
//     unbatched call would: one caller alone pays nothing;
//   - a call that finds every slot taken (or a batch already queued) joins
//     the queue; whoever frees a slot next sends the whole queue as one
//     go-redis pipeline, under a deadline that covers the latest of its
//     callers' own deadlines;
//   - a queued caller waits for its reply or its own context, whichever
//     ends first, and returns the same context error as an unbatched call
//     at once, even while its batch is still in flight. A call whose caller
//     left before its batch was formed is not sent.
//
// Only scripts on one record go through it (its key, and for reserve and
// cancel the token's cancel marker in the same slot). WAIT does not
// (durable.go): it must follow the reservation on the same connection,
// which a shared pipeline cannot promise.
//
// Why this over go-redis and not rueidis's automatic pipelining:
// BenchmarkScriptClients measured rueidis v1.0.79 12-18 % cheaper in total
// CPU (client and redis-server) per write up to 8 callers but 5-20 % dearer
// from 32 on, so no second client (docs/redis.md, "Which client").
type batcher struct {
	rdb         redis.UniversalClient
	callTimeout time.Duration // a batch's deadline when no caller has one
	slots       int           // batches in flight at most (DefaultBatchSlots)
	log         *slog.Logger  // for a batch that panicked

	mu      sync.Mutex
	pending []*scriptCall
	busy    int // slots taken: calls running on their own and batches in flight

	// sent counts the calls of batches handed to Redis: past that point a
	// caller that leaves no longer holds its call back. The tests wait on
	// it; a queue just emptied is not yet there (exec drops the calls
	// whose callers left first).
	sent atomic.Int64
}

// run runs sc on keys as one call of ctx, alone or in a batch.
func (b *batcher) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	b.mu.Lock()
	if len(b.pending) == 0 && b.busy < b.slots {
		b.busy++
		b.mu.Unlock()
		// Released even if the call panics (the store's method recovers).
		defer b.release()
		return runScript(ctx, b.rdb, sc, keys, args...)
	}
	c := &scriptCall{ctx: ctx, sc: sc, keys: keys, args: args, done: make(chan struct{})}
	// Every slot is taken, or a queue already waits for the next one to be
	// freed: whoever frees it sends the queue (release, send).
	b.pending = append(b.pending, c)
	b.mu.Unlock()
	return c.wait()
}

// wait returns the call's reply, or its caller's context error as soon as
// that context ends, even while the call's batch is in flight.
func (c *scriptCall) wait() *redis.Cmd {
	select {
	case <-c.done:
		return c.cmd
	case <-c.ctx.Done():
		cmd := redis.NewCmd(c.ctx)
		cmd.SetErr(c.ctx.Err())
		return cmd
	}
}

// release frees the slot of a call that ran on its own; a queue that
// formed meanwhile is sent in its place.
func (b *batcher) release() {
	b.mu.Lock()
	if len(b.pending) == 0 {
		b.busy--
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	go b.send()
}

// send holds one slot: it sends the queue as one batch, and again while
// calls queued meanwhile, then frees the slot.
func (b *batcher) send() {
	for {
		b.mu.Lock()
		batch := b.pending
		b.pending = nil
		if len(batch) == 0 {
			b.busy--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.exec(batch)
	}
}

// runAlone runs c on its own, on its caller's context, and hands it its
// reply; a panic fails c alone.
func (b *batcher) runAlone(c *scriptCall) {
	defer close(c.done)
	defer func() {
		if v := recover(); v != nil {
			c.cmd = failedCmd(c.ctx, panicked(b.log, "batch", v))
		}
	}()
	runScripts(c.ctx, b.rdb, []*scriptCall{c}, nil)
}

// exec sends one batch and hands every call its reply. It runs on a
// goroutine of its own, beyond the reach of the callers' recovery: a
// panic fails the calls not yet answered, and the batcher goes on.
func (b *batcher) exec(batch []*scriptCall) {
	live := batch[:0:0]
	answered := 0 // calls of live handed their reply, or to a goroutine that will
	defer func() {
		if v := recover(); v != nil {
			err := panicked(b.log, "batch", v)
			for _, c := range live[answered:] {
				c.cmd = failedCmd(c.ctx, err)
				close(c.done)
			}
		}
	}()
	var deadline time.Time
	for _, c := range batch {
		if c.ctx.Err() != nil {
			continue // its caller has left: not sent
		}
		// Every call has a deadline (Store.bound); the batch lasts as long
		// as the longest.
		if d, ok := c.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	b.sent.Add(int64(len(live)))
	if deadline.IsZero() {
		deadline = time.Now().Add(b.callTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	pipe := b.rdb.Pipeline()
	runScripts(ctx, pipe, live, func() {
		if _, err := pipe.Exec(ctx); err != nil {
			// go-redis stamps a failed pipeline's error on each command
			// (redis.go generalProcessPipelineFrom, osscluster.go
			// processPipeline: setCmdsErr); a call left with neither a
			// reply nor an error was never answered.
			for _, c := range live {
				if c.cmd.Err() == nil && c.cmd.Val() == nil {
					c.cmd.SetErr(err)
				}
			}
		}
	})
	for _, c := range live {
		if retryAlone(c.cmd.Err()) && c.ctx.Err() == nil {
			// go-redis retries a lone command after a broken connection or
			// a LOADING, READONLY, CLUSTERDOWN, TRYAGAIN or MASTERDOWN
			// reply (error.go, shouldRetry), reloading a cluster's slot map
			// on the way, but not a pipeline's command that got such a
			// reply (redis.go generalProcessPipelineFrom and osscluster.go
			// pipelineReadCmds retry only on transport errors, and only a
			// few times without a reload). A failover produces exactly
			// these, so such a call is run again on its own, on its
			// caller's context, as it would have been without batching.
			answered++
			go b.runAlone(c)
			continue
		}
		close(c.done)
		answered++
	}
}

// batchers gives each Redis primary a batcher of its own, so that a hung
// or slow node holds up only the calls for its own keys. A cluster's
// batch goes through the ClusterClient all the same, which follows MOVED
// and ASK (go-redis v9 osscluster.go, processPipelineNode, checkMovedErr)
// when the slot map it routed by is stale.
type batchers struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // nil: one primary, one batcher

	one    batcher
	mu     sync.Mutex
	byNode map[string]*batcher
}

func newBatchers(rdb redis.UniversalClient, callTimeout time.Duration, slots int, log *slog.Logger) *batchers {
	if slots <= 0 {
		slots = DefaultBatchSlots
	}
	bs := &batchers{rdb: rdb, one: batcher{rdb: rdb, callTimeout: callTimeout, slots: slots, log: log}}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		bs.cluster, bs.byNode = cc, map[string]*batcher{}
	}
	return bs
}

// run runs sc on keys, batched with concurrent calls to the same primary.
// The keys share one hash tag; the first one routes the call.
func (bs *batchers) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	if bs.cluster == nil {
		return bs.one.run(ctx, sc, keys, args...)
	}
	node, err := bs.cluster.MasterForKey(ctx, keys[0])
	if err != nil {
		// No slot map yet (or none to be had): the ClusterClient reports
		// why, as it would for an unbatched call.
		return bs.one.run(ctx, sc, keys, args...)
	}
	addr := node.Options().Addr
	bs.mu.Lock()
	b := bs.byNode[addr]
	if b == nil {
		b = &batcher{rdb: bs.rdb, callTimeout: bs.one.callTimeout, slots: bs.one.slots, log: bs.one.log}
		bs.byNode[addr] = b
	}
	bs.mu.Unlock()
	return b.run(ctx, sc, keys, args...)
}

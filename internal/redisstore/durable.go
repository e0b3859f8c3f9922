package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// waitMargin is kept free of WAIT at the end of the call budget, for the
// reply to come back.
const waitMargin = 5 * time.Millisecond

// reserveDurable reserves and, when the record is newly held, waits with
// WAIT until r.WaitReplicas replicas confirmed it.
//
// WAIT counts the replicas that acknowledged the writes of the connection
// it is sent on, so it must follow the script on the same connection of
// the primary that holds the key. Neither a pool nor a ClusterClient gives
// that: a cluster sends the keyless WAIT to every shard (its request
// policy), each on a connection that wrote nothing. So the store takes one
// connection of the key's primary (MasterForKey on a cluster, the client
// itself otherwise) for both commands.
//
// The two are sent together, in one round trip (a pipeline), rather than
// WAIT after the script's answer: a store in another region is tens of
// milliseconds away. Redis answers a WAIT at once when enough replicas
// have acknowledged the connection's last write (redis/src/replication.c
// waitCommand: replicationCountAcksByOffset(c->woff), blocking only
// below numreplicas), so when the script wrote nothing (a replay, a
// conflict) WAIT costs nothing more unless fewer replicas than asked are
// online, when a new reservation would fail anyway. Its answer is then
// ignored.
//
// If the replicas do not confirm in time, the reservation is released in
// the background (token-checked, so it can only remove this attempt's own
// record) and the call fails with idem.ErrNotDurable; the request was not
// let through, so releasing it is safe. If the release fails too, the
// record's lease ends and it turns unknown: never a second execution.
func (s *Store) reserveDurable(ctx context.Context, r idem.Reservation, args []any) (idem.ReserveResult, error) {
	keys := s.markerKeys(r.ID, r.Token)
	wait := r.WaitTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-waitMargin)
	}
	if wait < time.Millisecond { // WAIT 0 would wait forever
		return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w: no time left in the store budget for WAIT", idem.ErrNotDurable)
	}
	var (
		conn  *redis.Conn
		v     []any
		acked int64
		werr  error
		err   error
	)
	for attempt := 0; ; attempt++ {
		conn, err = s.connFor(ctx, keys[0])
		if err == nil {
			v, acked, werr, err = s.reserveAndWait(ctx, conn, keys, args, r.WaitReplicas, wait)
			if err == nil {
				break
			}
			_ = conn.Close()
			if ctx.Err() != nil {
				// The budget ended before both answers came: WAIT may
				// block past its own timeout, up to one tick of Redis's
				// clock (hz), and a pipeline's late reply fails every
				// command in it. The script, sent first, has run or
				// will: undo what it may have made, as when the
				// replicas do not confirm.
				go s.releaseNotDurable(r.ID, r.Token)
				return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w: no answer to the reservation and WAIT within the budget: %v",
					idem.ErrNotDurable, err)
			}
		}
		// A failover moved the slot or the primary: the client's view of
		// the topology is stale. Refresh it and try again, within budget;
		// repeating a reservation with the same token is harmless.
		if attempt >= 2 || !topologyChanged(err) || ctx.Err() != nil {
			return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w", err)
		}
		if cc, ok := s.rdb.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx)
		}
		select {
		case <-ctx.Done():
			return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w", ctx.Err())
		case <-time.After(time.Duration(attempt+1) * 5 * time.Millisecond):
		}
	}
	defer conn.Close()
	res, err := parseReserve(v)
	if err != nil {
		return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w", err)
	}
	if res.Outcome != idem.Reserved {
		return res, nil // nothing new was written that a request depends on
	}
	if werr == nil && acked >= int64(r.WaitReplicas) {
		return res, nil
	}
	go s.releaseNotDurable(r.ID, r.Token)
	if werr != nil {
		return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w: WAIT: %v", idem.ErrNotDurable, werr)
	}
	return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w: %d of %d replicas within %v",
		idem.ErrNotDurable, acked, r.WaitReplicas, wait)
}

// reserveAndWait sends the reservation script and WAIT on conn in one
// pipeline. A Redis that has forgotten the script (restarted, failed
// over) answers NOSCRIPT, and its WAIT then followed no write: the two are
// sent again, the script whole (runScripts). err is the script's failure,
// werr WAIT's.
func (s *Store) reserveAndWait(ctx context.Context, conn *redis.Conn, keys []string, args []any, replicas int, wait time.Duration) (v []any, acked int64, werr, err error) {
	var w *redis.Cmd
	p := conn.Pipeline()
	reserve := scriptCall{sc: s.s.reserve, keys: keys, args: args}
	runScripts(ctx, p, []*scriptCall{&reserve}, func() {
		// WAIT follows the script each time it is sent: Exec empties p
		// (go-redis pipeline.go). The Pipeliner has no Wait; it is sent as is.
		w = p.Do(ctx, "WAIT", replicas, wait.Milliseconds())
		_, _ = p.Exec(ctx)
	})
	v, err = reserve.cmd.Slice()
	acked, werr = w.Int64()
	return v, acked, werr, err
}

// releaseNotDurable removes a reservation whose replicas did not confirm
// it, with a budget of its own: nobody waits for it.
func (s *Store) releaseNotDurable(id idem.RecordID, tok idem.Token) {
	ctx, cancel := context.WithTimeout(context.Background(), s.callTimeout)
	defer cancel()
	_ = s.Release(ctx, id, tok)
}

// connFor returns one connection to the primary that holds key.
func (s *Store) connFor(ctx context.Context, key string) (*redis.Conn, error) {
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Conn(), nil
	case *redis.Client: // standalone, or Sentinel's failover client
		return c.Conn(), nil
	}
	return nil, fmt.Errorf("durability replicated needs a standalone, Sentinel or Cluster client, not %T", s.rdb)
}

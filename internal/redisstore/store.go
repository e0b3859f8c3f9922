// Package redisstore keeps idempotency records in Redis.
//
// Each record is one key, prefix + "{" + record id + "}": the id is a hash
// of (policy, scope, key), so client keys never appear in Redis, and the
// braces are a Cluster hash tag. Every state change is one Lua script
// (scripts/*.lua) run with EVALSHA on one record; each mirrors the
// transition rules of package idem and checks the attempt's token. The
// only other keys a script touches are a token's cancel marker beside its
// record (cancelledSep), in the record's slot. Lease expiry is judged by
// Redis TIME inside the scripts, so the servers' clocks do not matter.
package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	luascripts "github.com/idem-extproc/idem-extproc/internal/redisstore/scripts"
)

// scripts are built once per Store; redis.Script holds a script's source
// and its SHA1, and runScripts sends one or the other.
type scripts struct {
	reserve, renew, complete, release, watch, peek, cancel, purge, resolve *redis.Script
}

func loadScripts() scripts {
	return scripts{
		reserve:  redis.NewScript(luascripts.Source("reserve")),
		renew:    redis.NewScript(luascripts.Source("renew")),
		complete: redis.NewScript(luascripts.Source("complete")),
		release:  redis.NewScript(luascripts.Source("release")),
		watch:    redis.NewScript(luascripts.Source("watch")),
		peek:     redis.NewScript(luascripts.Source("peek")),
		cancel:   redis.NewScript(luascripts.Source("cancel")),
		purge:    redis.NewScript(luascripts.Source("purge")),
		resolve:  redis.NewScript(luascripts.Source("resolve")),
	}
}

// LoadScripts loads the store's scripts into Redis (every primary of a
// cluster: go-redis's ClusterClient.ScriptLoad runs on each shard,
// osscluster_commands.go), so that no call pays the round trip of an
// EVALSHA refused with NOSCRIPT and sent again as EVAL. It matters for a
// store a round trip of tens of milliseconds away (another region); a
// restarted Redis forgets them, and its first calls pay that trip once.
func (s *Store) LoadScripts(ctx context.Context) (err error) {
	defer s.recoverCall("script_load", &err)
	all := []*redis.Script{s.s.reserve, s.s.renew, s.s.complete, s.s.release, s.s.watch, s.s.peek, s.s.cancel}
	// At once, each on a connection of its own: one round trip, not seven.
	errs := make([]error, len(all))
	var wg sync.WaitGroup
	for i, sc := range all {
		wg.Go(func() { errs[i] = sc.Load(ctx, s.rdb).Err() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("redisstore: script load: %w", err)
	}
	return nil
}

// DefaultPrefix starts every key the store writes.
const DefaultPrefix = "idem:"

// Options configures a Store.
type Options struct {
	// Prefix starts every key; DefaultPrefix when empty.
	Prefix string
	// CallTimeout bounds each call, on top of the caller's deadline;
	// idem.DefaultStoreTimeout when zero.
	CallTimeout time.Duration
	// BatchSlots bounds the batches of script calls in flight at once to
	// one Redis primary (batch.go); DefaultBatchSlots when zero.
	BatchSlots int
	// Unbatched sends every call on its own pooled connection, as go-redis
	// does: for a Redis far enough away that waiting for a batch slot costs
	// more than the writes batching saves (BatchingFor).
	Unbatched bool
	// Logger receives the stack of a call that panicked (slog.Default
	// when nil).
	Logger *slog.Logger
}

// Store implements idem.Store on a go-redis UniversalClient: standalone,
// Sentinel or Cluster.
type Store struct {
	rdb         redis.UniversalClient
	prefix      string
	callTimeout time.Duration
	s           scripts
	hub         *hub
	batch       *batchers // nil: every call on its own (tests compare)
	log         *slog.Logger
}

var _ idem.Store = (*Store)(nil)

// New returns a Store using rdb. The caller keeps ownership of rdb.
func New(rdb redis.UniversalClient, opts Options) *Store {
	st := &Store{rdb: rdb, prefix: opts.Prefix, callTimeout: opts.CallTimeout, s: loadScripts(), log: opts.Logger}
	if st.log == nil {
		st.log = slog.Default()
	}
	st.hub = newHub(rdb, st.log)
	if st.prefix == "" {
		st.prefix = DefaultPrefix
	}
	if st.callTimeout <= 0 {
		st.callTimeout = idem.DefaultStoreTimeout
	}
	if !opts.Unbatched {
		st.batch = newBatchers(rdb, st.callTimeout, opts.BatchSlots, st.log)
	}
	return st
}

// Close ends the store's pub/sub connection, if Watch opened one. The
// client passed to New stays open.
func (s *Store) Close() error { return s.hub.close() }

// Key returns the Redis key of a record.
func (s *Store) Key(id idem.RecordID) string { return s.prefix + "{" + string(id) + "}" }

// cancelledSep joins a record's key and a token into the key of the marker
// that says the token's reservation of the record was cancelled
// (cancel.lua), which reserve.lua reads as its KEYS[2]. It extends the
// record's key, so it carries the same hash tag and sits in the record's
// Cluster slot; no record's key has anything after its closing brace.
const cancelledSep = ":cancelled:"

// markerKeys is KEYS of reserve.lua and cancel.lua: the record's key and
// its token's cancel marker (cancelledSep, then the token in hex), built as one string of which
// the record's key is the head, so that a reservation pays one key
// allocation, not three.
func (s *Store) markerKeys(id idem.RecordID, tok idem.Token) []string {
	var hexTok [2 * len(idem.Token{})]byte
	hex.Encode(hexTok[:], tok[:])
	var b strings.Builder
	b.Grow(len(s.prefix) + len(id) + 2 + len(cancelledSep) + len(hexTok))
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteString(string(id))
	b.WriteByte('}')
	n := b.Len()
	b.WriteString(cancelledSep)
	b.Write(hexTok[:])
	marker := b.String()
	return []string{marker[:n], marker}
}

// bound limits a call to the store's call timeout. A caller whose own
// deadline comes first (the server bounds each call by the same budget)
// keeps its context: a second timer could only fire later, and each costs
// allocations on every call.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= s.callTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.callTimeout)
}

// Reserve implements idem.Store.
func (s *Store) Reserve(ctx context.Context, r idem.Reservation) (_ idem.ReserveResult, err error) {
	defer s.recoverCall("reserve", &err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	args := reserveArgs(&r)
	if r.WaitReplicas > 0 {
		return s.reserveDurable(ctx, r, args)
	}
	keys := s.markerKeys(r.ID, r.Token)
	v, err := s.run(ctx, s.s.reserve, keys, args...).Slice()
	if err != nil && isOOM(err) {
		// Redis is full and refuses writes: answer a known operation all
		// the same (replay, 409, 422); only a new key is refused.
		pv, perr := s.run(ctx, s.s.peek, keys[:1], r.Fingerprint[:]).Slice()
		if perr == nil && len(pv) > 0 && pv[0] != "absent" {
			v, err = pv, nil
		}
	}
	if err != nil {
		return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w", err)
	}
	res, err := parseReserve(v)
	if err != nil {
		return idem.ReserveResult{}, fmt.Errorf("redisstore: reserve: %w", err)
	}
	if res.Outcome == idem.Moved && r.HandOverTo != "" && res.Home == r.HandOverTo {
		res.Outcome = idem.HandedOver // the tombstone peek.lua read is this hand-over's
	}
	return res, nil
}

// reserveArgs is ARGV of reserve.lua for r.
func reserveArgs(r *idem.Reservation) []any {
	expiry := "u"
	if r.LeaseExpiry == idem.LeaseExpiryReexecute {
		expiry = "r"
	}
	return []any{r.Fingerprint[:], r.Token[:], r.Lease.Milliseconds(), r.Retention.Milliseconds(), expiry, r.HandOverTo}
}

// completeArgs is ARGV of complete.lua.
func completeArgs(tok idem.Token, resp *idem.Response, retention time.Duration) []any {
	return []any{tok[:], retention.Milliseconds(), encodeResponseHead(resp), resp.Body}
}

// run runs the script sc on keys, which all share the first one's hash
// tag (one Cluster slot), written to Redis together with the concurrent
// calls of other streams (batch.go).
func (s *Store) run(ctx context.Context, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	if s.batch == nil {
		return runScript(ctx, s.rdb, sc, keys, args...)
	}
	return s.batch.run(ctx, sc, keys, args...)
}

func parseReserve(v []any) (idem.ReserveResult, error) {
	if len(v) < 3 {
		return idem.ReserveResult{}, fmt.Errorf("unexpected reply of %d elements", len(v))
	}
	outcome, _ := v[0].(string)
	attempt, _ := v[1].(int64)
	created, _ := v[2].(int64)
	res := idem.ReserveResult{Attempt: int(attempt)}
	if created > 0 {
		res.CreatedAt = time.UnixMilli(created)
	}
	switch outcome {
	case "reserved":
		res.Outcome = idem.Reserved
	case "mismatch":
		res.Outcome = idem.Mismatch
	case "in_flight":
		res.Outcome = idem.InFlight
	case "unknown":
		res.Outcome = idem.Unknown
	case "cancelled":
		return idem.ReserveResult{}, idem.ErrCancelled
	case "damaged":
		return idem.ReserveResult{}, fmt.Errorf("the key holds no record the scripts write: %w", errCorrupt)
	case "moved", "handed_over":
		res.Outcome = idem.Moved
		if outcome == "handed_over" {
			res.Outcome = idem.HandedOver
		}
		if len(v) != 4 {
			return idem.ReserveResult{}, fmt.Errorf("%s reply of %d elements", outcome, len(v))
		}
		res.Home, _ = v[3].(string)
	case "completed":
		if len(v) != 4 {
			return idem.ReserveResult{}, fmt.Errorf("completed reply of %d elements", len(v))
		}
		rec, _ := v[3].(string)
		n := completedHeadLen(rec)
		if n == 0 {
			return idem.ReserveResult{}, fmt.Errorf("completed record of %d bytes: %w", len(rec), errCorrupt)
		}
		resp, err := decodeResponse(rec[n:])
		if err != nil {
			return idem.ReserveResult{}, err
		}
		res.Outcome = idem.Completed
		res.Response = resp
	default:
		return idem.ReserveResult{}, fmt.Errorf("unexpected outcome %q", outcome)
	}
	return res, nil
}

// Renew implements idem.Store.
func (s *Store) Renew(ctx context.Context, id idem.RecordID, tok idem.Token, lease time.Duration) error {
	return s.transition(ctx, "renew", s.s.renew, id, tok[:], lease.Milliseconds())
}

// Complete implements idem.Store.
func (s *Store) Complete(ctx context.Context, id idem.RecordID, tok idem.Token, resp idem.Response, retention time.Duration) error {
	return s.transition(ctx, "complete", s.s.complete, id, completeArgs(tok, &resp, retention)...)
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, id idem.RecordID, tok idem.Token) error {
	return s.transition(ctx, "release", s.s.release, id, tok[:])
}

// MarkUnknown implements idem.Store: release.lua, given a retention.
func (s *Store) MarkUnknown(ctx context.Context, id idem.RecordID, tok idem.Token, retention time.Duration) error {
	return s.transition(ctx, "mark_unknown", s.s.release, id, tok[:], retention.Milliseconds())
}

// Cancel implements idem.Store.
func (s *Store) Cancel(ctx context.Context, id idem.RecordID, tok idem.Token, hold time.Duration) (_ idem.CancelResult, err error) {
	defer s.recoverCall("cancel", &err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	n, err := s.run(ctx, s.s.cancel, s.markerKeys(id, tok), tok[:], max(hold.Milliseconds(), 1)).Int()
	if err != nil {
		return 0, fmt.Errorf("redisstore: cancel: %w", err)
	}
	if n == 1 {
		return idem.CancelReleased, nil
	}
	return idem.CancelNotHeld, nil
}

// transition runs a token-checked script whose reply is 1 (applied), 0 (no
// record) or -1 (token does not hold the record).
func (s *Store) transition(ctx context.Context, op string, sc *redis.Script, id idem.RecordID, args ...any) (err error) {
	defer s.recoverCall(op, &err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	n, err := s.run(ctx, sc, []string{s.Key(id)}, args...).Int()
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	switch n {
	case 1:
		return nil
	case 0:
		return fmt.Errorf("redisstore: %s: %w", op, idem.ErrNotFound)
	default:
		return fmt.Errorf("redisstore: %s: %w", op, idem.ErrNotHolder)
	}
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, id idem.RecordID) (_ idem.Record, err error) {
	defer s.recoverCall("get", &err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	key := s.Key(id)
	// A completed record is a string, any other a hash (codec.go); reading
	// one as the other fails with WRONGTYPE, so the second read is taken
	// only for completed records (this is the admin path, not the hot one).
	var rec idem.Record
	m, err := s.rdb.HGetAll(ctx, key).Result()
	if isWrongType(err) {
		var v string
		if v, err = s.rdb.Get(ctx, key).Result(); err == nil {
			rec, err = parseCompleted(v)
		} else if isWrongType(err) {
			err = fmt.Errorf("neither a hash nor a string: %w", errCorrupt)
		}
	} else if err == nil {
		rec, err = parseRecord(m)
	}
	if errors.Is(err, redis.Nil) {
		err = idem.ErrNotFound // expired between the two reads
	}
	if err != nil {
		return idem.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	return rec, nil
}

func parseRecord(m map[string]string) (idem.Record, error) {
	if len(m) == 0 {
		return idem.Record{}, idem.ErrNotFound
	}
	// A time field that is absent or no number leaves its time zero.
	millis := func(field string) time.Time {
		if ms, err := strconv.ParseInt(m[field], 10, 64); err == nil {
			return time.UnixMilli(ms)
		}
		return time.Time{}
	}
	rec := idem.Record{CreatedAt: millis("c")}
	switch m["s"] {
	case "m":
		rec.State, rec.Home = idem.StateMoved, m["h"]
		return rec, nil
	case "i":
		rec.State = idem.StateInFlight
	case "u":
		rec.State = idem.StateUnknown
	default:
		return rec, fmt.Errorf("state %q: %w", m["s"], errCorrupt)
	}
	if len(m["f"]) != len(rec.Fingerprint) || len(m["t"]) != len(rec.Token) {
		return rec, fmt.Errorf("fingerprint or token of the wrong length: %w", errCorrupt)
	}
	copy(rec.Fingerprint[:], m["f"])
	copy(rec.Token[:], m["t"])
	rec.LeaseUntil = millis("l")
	rec.Attempts, _ = strconv.Atoi(m["a"])
	return rec, nil
}

// Ping implements idem.Store.
func (s *Store) Ping(ctx context.Context) (err error) {
	defer s.recoverCall("ping", &err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

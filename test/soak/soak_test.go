package soak

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
)

var (
	duration = flag.Duration("soak.duration", 15*time.Second, "how long clients send requests")
	clients  = flag.Int("soak.clients", 12, "concurrent clients")
	scopes   = flag.Int("soak.scopes", 4, "scopes (:authority values)")
	keys     = flag.Int("soak.keys", 30, "operation keys per scope; fewer keys, more duplicates")
	maxReqs  = flag.Int("soak.requests", 0, "stop after this many requests (0: no limit)")
	seed     = flag.Uint64("soak.seed", 1, "seed of every random choice")
	faultGap = flag.Duration("soak.faultevery", 1500*time.Millisecond, "mean time between Redis or server faults")
)

// answer is what a client saw that claims to come from the upstream: a
// first answer or a replay.
type answer struct {
	scope, key, status, body, location, effect string
	// headers are the upstream's own headers as the client got them
	// (content-type, and x-multi twice, in order): a replay repeats them.
	headers string
	replay  bool
	// bodyOmitted marks a replay of a response whose body was never
	// stored whole (the stream ended inside it): it repeats status and
	// headers, and says so.
	bodyOmitted bool
}

type counts struct {
	requests, fresh, replays, omitted, inProgress, unknown, mismatch, unavailable, proxyErrors, resets, slow atomic.Int64
	redisRestarts, serverRestarts                                                                            atomic.Int64
}

// TestSoak is the chaos soak at CI size; -soak.duration, -soak.clients,
// -soak.keys, -soak.scopes, -soak.seed and -soak.requests make it bigger.
func TestSoak(t *testing.T) {
	// Redis keeps its data across a kill (AOF, fsync always): without it a
	// restart forgets reservations and a retry may run again, which is why
	// docs/redis.md requires persistence or replication.
	srv := redistest.Start(t, redistest.Options{Persist: true})
	p := policy.Default()
	p.Lease = 2 * time.Second // lost completions turn unknown within the soak
	env := harness.Start(t, harness.Options{
		Store: harness.OnRedis(srv), Policies: &policy.Set{Policies: []*policy.Policy{p}},
		StoreTimeout: 250 * time.Millisecond, ExpectProcessingErrors: true,
	})

	var c counts
	var mu sync.Mutex
	var answers []answer
	stop := make(chan struct{})
	var stopOnce sync.Once
	end := func() { stopOnce.Do(func() { close(stop) }) }
	time.AfterFunc(*duration, end)

	// Faults: Redis killed and restarted, or the ext_proc server crashed
	// and restarted, on a seeded schedule.
	var chaos sync.WaitGroup
	chaos.Go(func() {
		rng := rand.New(rand.NewPCG(*seed, 0xc4a05))
		for {
			select {
			case <-stop:
				return
			case <-time.After(*faultGap/2 + time.Duration(rng.Int64N(int64(*faultGap)))):
			}
			down := 100*time.Millisecond + time.Duration(rng.Int64N(int64(400*time.Millisecond)))
			if rng.IntN(2) == 0 {
				srv.Kill()
				time.Sleep(down)
				srv.Restart()
				c.redisRestarts.Add(1)
			} else {
				env.CrashServer()
				time.Sleep(down)
				env.StartServer()
				c.serverRestarts.Add(1)
			}
		}
	})

	began := time.Now()
	var wg sync.WaitGroup
	for i := range *clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(*seed, uint64(i)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if n := c.requests.Add(1); *maxReqs > 0 && n > int64(*maxReqs) {
					c.requests.Add(-1)
					end()
					return
				}
				scope := fmt.Sprintf("tenant-%d.example", rng.IntN(*scopes))
				// A fresh set of operations every two seconds, each sent
				// many times, some also later on.
				epoch := int(time.Since(began) / (2 * time.Second))
				if epoch > 0 && rng.IntN(10) == 0 {
					epoch--
				}
				key := fmt.Sprintf("op-%d-%d", epoch, rng.IntN(*keys))
				body := fmt.Sprintf(`{"scope":%q,"key":%q}`, scope, key)
				if rng.IntN(40) == 0 { // the same key for another operation
					body = fmt.Sprintf(`{"scope":%q,"key":%q,"other":true}`, scope, key)
				}
				req := &envoysim.Request{Method: http.MethodPost, Path: "/orders", Authority: scope,
					Headers: []envoysim.Header{{Name: "idempotency-key", Value: key}, {Name: "content-type", Value: "application/json"}},
					Body:    []byte(body)}
				if rng.IntN(8) == 0 {
					req.Headers = append(req.Headers, envoysim.Header{Name: "x-upstream-delay",
						Value: strconv.Itoa(50+rng.IntN(400)) + "ms"})
					c.slow.Add(1)
				}
				switch rng.IntN(25) {
				case 0:
					req.ResetAfter = envoysim.PhaseRequestBody
					c.resets.Add(1)
				case 1:
					req.ResetAfter = envoysim.PhaseUpstream
					c.resets.Add(1)
				}
				res := env.Exchange(req)
				if res.Response == nil {
					continue // the client went away
				}
				r := res.Response
				replayed, _ := envoysim.Get(r.Headers, "idempotent-replayed")
				switch {
				case r.Status == http.StatusCreated:
					if replayed == "true" {
						c.replays.Add(1)
						if v, _ := envoysim.Get(r.Headers, "idempotent-body-omitted"); v == "true" {
							c.omitted.Add(1)
						}
					} else {
						c.fresh.Add(1)
					}
					loc, _ := envoysim.Get(r.Headers, "location")
					eff, _ := envoysim.Get(r.Headers, "x-effect")
					omitted, _ := envoysim.Get(r.Headers, "idempotent-body-omitted")
					ct, _ := envoysim.Get(r.Headers, "content-type")
					upstreamHeaders := ct + "|" + strings.Join(envoysim.Values(r.Headers, "x-multi"), ",")
					mu.Lock()
					answers = append(answers, answer{scope: scope, key: key, status: strconv.Itoa(r.Status),
						body: string(r.Body), location: loc, effect: eff, replay: replayed == "true", bodyOmitted: omitted == "true",
						headers: upstreamHeaders})
					mu.Unlock()
				case r.Status == http.StatusConflict && strings.Contains(string(r.Body), "request-in-progress"):
					c.inProgress.Add(1)
				case r.Status == http.StatusConflict && strings.Contains(string(r.Body), "outcome-unknown"):
					c.unknown.Add(1)
				case r.Status == http.StatusUnprocessableEntity:
					c.mismatch.Add(1)
				case r.Status == http.StatusServiceUnavailable && strings.Contains(string(r.Body), "idempotency-store-unavailable"):
					c.unavailable.Add(1)
					time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond) // Retry-After, shortened
				default: // Envoy's own 500/504 when the ext_proc server is down or slow
					c.proxyErrors.Add(1)
					time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	end()
	chaos.Wait()

	violations := check(t, env.Upstream.Effects(), answers)
	effects := len(env.Upstream.Effects())
	faults := c.redisRestarts.Load() + c.serverRestarts.Load() + c.resets.Load() + c.slow.Load()
	line := fmt.Sprintf("SOAK seed=%d duration=%v clients=%d scopes=%d keys=%d requests=%d effects=%d fresh=%d replays=%d replays_without_body=%d "+
		"in_progress=%d unknown=%d mismatch=%d unavailable=%d proxy_errors=%d faults=%d redis_restarts=%d "+
		"server_restarts=%d client_resets=%d slow_upstreams=%d duplicates_prevented=%d violations=%d",
		*seed, *duration, *clients, *scopes, *keys, c.requests.Load(), effects, c.fresh.Load(), c.replays.Load(), c.omitted.Load(),
		c.inProgress.Load(), c.unknown.Load(), c.mismatch.Load(), c.unavailable.Load(), c.proxyErrors.Load(), faults,
		c.redisRestarts.Load(), c.serverRestarts.Load(), c.resets.Load(), c.slow.Load(),
		c.replays.Load()+c.inProgress.Load()+c.unknown.Load()+c.mismatch.Load(), violations)
	t.Log(line)
	fmt.Println(line)
	if violations != 0 {
		t.Fatalf("%d violations", violations)
	}
	if c.redisRestarts.Load() == 0 || c.serverRestarts.Load() == 0 || c.replays.Load() == 0 {
		t.Fatalf("the soak did not exercise what it should: %s", line)
	}
}

// check verifies the invariants from the upstream's effect log and
// returns the number of violations, each reported.
func check(t *testing.T, effects []harness.Effect, answers []answer) int {
	violations := 0
	report := func(format string, args ...any) {
		violations++
		if violations <= 20 {
			t.Errorf(format, args...)
		}
	}
	type op struct{ scope, key string }
	byOp := map[op]harness.Effect{}
	bySeq := map[string]harness.Effect{}
	for _, e := range effects {
		o := op{e.Authority, e.Key}
		// At most one effect per (scope, key).
		if prev, dup := byOp[o]; dup {
			report("operation %v ran twice: effects %d and %d", o, prev.Seq, e.Seq)
		}
		byOp[o] = e
		bySeq[strconv.Itoa(e.Seq)] = e
		// The request that ran belongs to its scope and key.
		var sent struct{ Scope, Key string }
		if err := json.Unmarshal([]byte(e.Body), &sent); err != nil || sent.Scope != e.Authority || sent.Key != e.Key {
			report("effect %d ran %q for scope %s key %s", e.Seq, e.Body, e.Authority, e.Key)
		}
	}
	for _, a := range answers {
		e, ok := bySeq[a.effect]
		switch {
		case !ok:
			report("answer for %s %s names effect %q, which never happened", a.scope, a.key, a.effect)
			continue
		case e.Authority != a.scope || e.Key != a.key:
			report("answer for %s %s is effect %d of %s %s: it crossed operations", a.scope, a.key, e.Seq, e.Authority, e.Key)
		case a.bodyOmitted && (!a.replay || a.body != ""):
			report("answer for %s %s claims an omitted body but is not an empty replay", a.scope, a.key)
		case (a.body != e.ResponseBody && !a.bodyOmitted) || a.status != strconv.Itoa(e.Status) || a.location != "/orders/"+a.effect ||
			a.headers != wantHeaders(a):
			report("answer for %s %s (replay %v) is not byte-identical to effect %d: %s %q %s vs %d %q",
				a.scope, a.key, a.replay, e.Seq, a.status, a.body, a.headers, e.Status, e.ResponseBody)
		}
	}
	return violations
}

// wantHeaders is what an answer repeats of the upstream's own headers. A
// replay whose body was never stored whole drops content-type, which would
// describe a body it does not carry.
func wantHeaders(a answer) string {
	if a.bodyOmitted {
		return "|first,second"
	}
	return "application/json|first,second"
}

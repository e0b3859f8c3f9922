package loadtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// kind is what one request is.
type kind uint8

const (
	// kindFirstWrite: a POST with a key never seen: 4 messages, reserve
	// and complete.
	kindFirstWrite kind = iota
	// kindReplay: the same POST, body and key as a completed one: answered
	// at the request body from the record.
	kindReplay
	// kindUnprotected: a GET (or a POST without a key): answered at the
	// request headers with the skip-everything override.
	kindUnprotected
	numKinds
)

func (k kind) String() string {
	return [...]string{"first-write", "replay", "unprotected"}[k]
}

// workload is the requests a run sends.
type workload struct {
	scenario string
	// For the mixed scenario: the share of unprotected requests, and of
	// protected ones that replay a completed key.
	unprotectedRate, duplicateRate float64
	// keys is the key space replays draw from: that many keys are
	// completed before the run.
	keys int
	// keyless makes unprotected requests POSTs without a key instead of
	// GETs.
	keyless           bool
	reqBody, respBody []byte
	authority, path   string
	unprotectedPath   string
	contentType       string
	upstreamStatus    int
	upstreamGetStatus int
	upstreamLocation  string
	// messageTimeout replaces the recommended filter's message_timeout
	// when positive (the smoke test's, on a loaded machine).
	messageTimeout time.Duration
}

func newWorkload(scenario string, reqBody int, respBody []byte) *workload {
	w := &workload{
		scenario:          scenario,
		authority:         "api.example.com",
		path:              "/v1/orders",
		unprotectedPath:   "/v1/orders/0123456789",
		contentType:       "application/json",
		upstreamStatus:    201,
		upstreamGetStatus: 200,
		upstreamLocation:  "/v1/orders/0123456789",
	}
	w.reqBody = jsonBody(reqBody, "customer")
	w.respBody = respBody
	return w
}

// jsonBody is a JSON object of exactly n bytes (at least 16).
func jsonBody(n int, field string) []byte {
	head := `{"` + field + `":"`
	n = max(n, len(head)+2)
	return []byte(head + strings.Repeat("x", n-len(head)-2) + `"}`)
}

// needsKeys reports whether replays draw from completed keys.
func (w *workload) needsKeys() bool {
	return w.scenario == scenarioReplay || (w.scenario == scenarioMixed && w.duplicateRate > 0 && w.unprotectedRate < 1)
}

// upstream is the application behind Envoy, in process: writes get 201 and
// the response body, reads 200 and no body, so a server that does not
// skip them sees exactly the two header phases.
func (w *workload) upstream(_ context.Context, r *envoysim.Request) (*envoysim.Response, error) {
	if r.Method == "GET" {
		return &envoysim.Response{Status: w.upstreamGetStatus, Headers: []envoysim.Header{{Name: "content-type", Value: w.contentType}}}, nil
	}
	return &envoysim.Response{Status: w.upstreamStatus, Headers: []envoysim.Header{
		{Name: "content-type", Value: w.contentType}, {Name: "location", Value: w.upstreamLocation},
	}, Body: w.respBody}, nil
}

func (w *workload) write(key string) *envoysim.Request {
	hs := []envoysim.Header{{Name: "content-type", Value: w.contentType}}
	if key != "" {
		hs = append(hs, envoysim.Header{Name: "idempotency-key", Value: key})
	}
	return &envoysim.Request{Method: "POST", Path: w.path, Authority: w.authority, Headers: hs, Body: w.reqBody}
}

func (w *workload) unprotected() *envoysim.Request {
	if w.keyless {
		return w.write("")
	}
	return &envoysim.Request{Method: "GET", Path: w.unprotectedPath, Authority: w.authority,
		Headers: []envoysim.Header{{Name: "accept", Value: w.contentType}}}
}

// check says whether a request got what it should from a server, and if
// not, why. Every server must send the upstream's answer, or the replay;
// the message counts prove each server saw the sequence expected of it.
func (w *workload) check(srv string, k kind, res *envoysim.Result) string {
	if res.ProcessingError != nil {
		return "ext_proc error: " + res.ProcessingError.Error()
	}
	if res.Response == nil {
		return "no response"
	}
	wantMsgs, wantStatus, wantUpstream := 4, w.upstreamStatus, true
	switch {
	case k == kindReplay && srv != serverNoop:
		wantMsgs, wantUpstream = 2, false
	case k == kindUnprotected && srv == serverNoop && !w.keyless:
		wantMsgs = 2
	case k == kindUnprotected && srv != serverNoop:
		wantMsgs = 1
	}
	if k == kindUnprotected && !w.keyless {
		wantStatus = w.upstreamGetStatus
	}
	switch {
	case res.Response.Status != wantStatus:
		return fmt.Sprintf("%s: status %d, want %d (%v)", k, res.Response.Status, wantStatus, res)
	case res.UpstreamCalled != wantUpstream:
		return fmt.Sprintf("%s: upstream called %v, want %v (%v)", k, res.UpstreamCalled, wantUpstream, res)
	case len(res.Messages) != wantMsgs:
		return fmt.Sprintf("%s: %d ext_proc messages, want %d (%v)", k, len(res.Messages), wantMsgs, res)
	}
	if k == kindReplay && srv != serverNoop {
		if len(res.Response.Body) != len(w.respBody) {
			return fmt.Sprintf("replay: body of %d bytes, want %d", len(res.Response.Body), len(w.respBody))
		}
		if v, _ := envoysim.Get(res.Response.Headers, idem.ReplayedHeader); srv == serverIdem && v != "true" {
			return "replay: no " + idem.ReplayedHeader + " header"
		}
	}
	return ""
}

// recorder is one worker's measurements.
type recorder struct {
	on     *atomic.Bool
	phases [envoysim.PhaseResponseTrailers + 1][]time.Duration
	total  []time.Duration
	kinds  [numKinds]int
	errs   int
	errMsg string
}

func (r *recorder) onReply(p envoysim.Phase, d time.Duration) {
	if r.on.Load() {
		r.phases[p] = append(r.phases[p], d)
	}
}

// worker is one concurrent stream of requests, as one downstream
// connection of Envoy's would send them: one after the other.
type worker struct {
	wl     *workload
	srv    string
	filter *envoysim.Filter
	rec    *recorder
	rng    *rand.Rand
	prefix []byte
	seq    int
	keys   []string
}

func (w *worker) next() (kind, *envoysim.Request) {
	k := kindFirstWrite
	switch w.wl.scenario {
	case scenarioReplay:
		k = kindReplay
	case scenarioUnprotected:
		k = kindUnprotected
	case scenarioMixed:
		switch {
		case w.rng.Float64() < w.wl.unprotectedRate:
			k = kindUnprotected
		case len(w.keys) > 0 && w.rng.Float64() < w.wl.duplicateRate:
			k = kindReplay
		}
	}
	switch k {
	case kindReplay:
		return k, w.wl.write(w.keys[w.rng.IntN(len(w.keys))])
	case kindUnprotected:
		return k, w.wl.unprotected()
	}
	w.seq++
	return k, w.wl.write(string(strconv.AppendInt(w.prefix, int64(w.seq), 10)))
}

func (w *worker) loop(ctx context.Context, stop *atomic.Bool) {
	for !stop.Load() {
		k, req := w.next()
		start := time.Now()
		res := w.filter.Do(ctx, req, w.wl.upstream)
		d := time.Since(start)
		if !w.rec.on.Load() {
			continue
		}
		w.rec.total = append(w.rec.total, d)
		w.rec.kinds[k]++
		if why := w.wl.check(w.srv, k, res); why != "" {
			w.rec.errs++
			if w.rec.errMsg == "" {
				w.rec.errMsg = why
			}
		}
	}
}

// driver sends a run's load to one server through envoysim filters over
// a few gRPC connections, as Envoy's workers do.
type driver struct {
	conns   []*grpc.ClientConn
	workers []*worker
	recs    []*recorder
	on      atomic.Bool
}

var runSeq atomic.Int64

func newDriver(addr string, conns, concurrency int, srv string, wl *workload) (*driver, error) {
	d := &driver{}
	for range conns {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			d.close()
			return nil, err
		}
		d.conns = append(d.conns, cc)
	}
	run := runSeq.Add(1)
	for i := range concurrency {
		rec := &recorder{on: &d.on}
		cfg := envoysim.RecommendedConfig()
		if wl.messageTimeout > 0 {
			cfg.MessageTimeout = durationpb.New(wl.messageTimeout)
		}
		w := &worker{
			wl: wl, srv: srv, rec: rec,
			filter: envoysim.NewFilter(d.conns[i%conns], cfg, envoysim.Options{OnReply: rec.onReply}),
			rng:    rand.New(rand.NewPCG(uint64(run), uint64(i))),
			prefix: fmt.Appendf(nil, "w%d-%d-%d-", time.Now().UnixNano(), run, i),
		}
		d.workers = append(d.workers, w)
		d.recs = append(d.recs, rec)
	}
	return d, nil
}

func (d *driver) close() {
	for _, cc := range d.conns {
		_ = cc.Close()
	}
}

// prepareAttempts is how many keys prepare tries for each one it needs.
const prepareAttempts = 3

// prepare completes n keys through the same filters, for replays. A key
// whose first write fails (on a loaded machine a call can outlast its
// budget or the filter's message timeout) is given up and replaced by a
// fresh one, since a replay of a key left in flight would be answered as
// a conflict; prepare fails when prepareAttempts keys in a row fail for
// one slot, with the first reason.
func (d *driver) prepare(ctx context.Context, n int) ([]string, error) {
	keys := make([]string, n)
	prefix := fmt.Sprintf("p%d-%d-", time.Now().UnixNano(), runSeq.Load())
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]string, len(d.workers))
	for i, w := range d.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := int(next.Add(1)) - 1
				if j >= n || errs[i] != "" {
					return
				}
				for attempt := range prepareAttempts {
					key := prefix + strconv.Itoa(j)
					if attempt > 0 {
						key += "-" + strconv.Itoa(attempt)
					}
					res := w.filter.Do(ctx, w.wl.write(key), w.wl.upstream)
					why := w.wl.check(w.srv, kindFirstWrite, res)
					if why == "" {
						keys[j] = key
						break
					}
					if attempt == prepareAttempts-1 {
						errs[i] = fmt.Sprintf("%s (%d keys in a row)", why, prepareAttempts)
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			return nil, fmt.Errorf("preparing %d completed keys: %s", n, e)
		}
	}
	for _, w := range d.workers {
		w.keys = keys
	}
	return keys, nil
}

// warm runs the load for d, measuring nothing.
func (d *driver) warm(ctx context.Context, dur time.Duration) {
	d.measure(ctx, dur, 0, func(bool) {})
}

// measure runs the load for warmup, then measures it for duration, calling
// mark at both edges of the measured window (to read CPU and counters).
func (d *driver) measure(ctx context.Context, warmup, duration time.Duration, mark func(start bool)) time.Duration {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, w := range d.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.loop(ctx, &stop)
		}()
	}
	time.Sleep(warmup)
	var elapsed time.Duration
	if duration > 0 {
		mark(true)
		start := time.Now()
		d.on.Store(true)
		time.Sleep(duration)
		d.on.Store(false)
		elapsed = time.Since(start)
		mark(false)
	}
	stop.Store(true)
	wg.Wait()
	return elapsed
}

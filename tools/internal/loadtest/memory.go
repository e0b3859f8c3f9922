package loadtest

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/fingerprint"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/redis/go-redis/v9"
)

// memoryFigures is what one record costs in Redis.
type memoryFigures struct {
	redisVersion string
	bodyBytes    int
	// MEMORY USAGE of one record (key, value, and Redis's own overhead as
	// it estimates it), with OBJECT ENCODING.
	inFlight, completed       int64
	inFlightEnc, completedEnc string
	// used_memory growth per record over many records: what Redis really
	// allocates, the keyspace's and expiry table's entries included.
	perInFlight, perCompleted float64
	records                   int
}

// measureMemory writes records exactly as the server does (the Redis store,
// the default policy, the load tool's request and response) and asks
// Redis what they cost.
func measureMemory(ctx context.Context, r *redisServer, respBody []byte, records int) (memoryFigures, error) {
	m := memoryFigures{redisVersion: r.version(ctx), bodyBytes: len(respBody), records: records}
	rdb, err := redisstore.NewClient(r.url, time.Second)
	if err != nil {
		return m, err
	}
	defer rdb.Close()
	st := redisstore.New(rdb, redisstore.Options{})
	defer st.Close()
	p := newMemoryProbe(r, rdb, st, respBody)

	id, tok, err := p.reserve(ctx, -1)
	if err != nil {
		return m, err
	}
	if m.inFlight, m.inFlightEnc, err = p.usage(ctx, id); err != nil {
		return m, err
	}
	if err := st.Complete(ctx, id, tok, p.resp, p.pol.Retention); err != nil {
		return m, err
	}
	if m.completed, m.completedEnc, err = p.usage(ctx, id); err != nil {
		return m, err
	}
	_ = st.Purge(ctx, id)

	if records <= 0 {
		return m, nil
	}
	m.perInFlight, m.perCompleted, err = p.growth(ctx, records)
	return m, err
}

// memoryProbe writes records as the server does and reads what they cost.
type memoryProbe struct {
	r      *redisServer
	rdb    redis.UniversalClient
	st     *redisstore.Store
	pol    *policy.Policy
	wl     *workload
	fp     idem.Fingerprint
	resp   idem.Response
	prefix string // of the keys, unique to this probe
}

// newMemoryProbe prepares the default policy's records of the load tool's
// request, completed with its upstream's response of body respBody.
func newMemoryProbe(r *redisServer, rdb redis.UniversalClient, st *redisstore.Store, respBody []byte) *memoryProbe {
	pol := policy.Default()
	wl := newWorkload(scenarioFirstWrite, 256, respBody)
	fp := fingerprint.Compute(fingerprint.Request{Method: "POST", Path: wl.path,
		Headers: []idem.Header{{Name: "content-type", Value: wl.contentType}}, Body: wl.reqBody}, pol.FingerprintHeaders)
	// What the server stores of the load tool's upstream response: every
	// header but x-envoy-upstream-service-time (x-envoy-* are never kept).
	resp := idem.Response{Status: wl.upstreamStatus, Body: respBody, Headers: []idem.Header{
		{Name: "content-type", Value: wl.contentType}, {Name: "location", Value: wl.upstreamLocation},
	}}
	// Compressed as the default policy compresses it before storing. The
	// load tool's body repeats one byte and compresses to almost nothing:
	// the figures of realistic answers are TestMemoryPerRecord's
	// (internal/redisstore).
	if c := pol.Compression.Codec; c != nil {
		resp = c.Compress(resp)
	}
	prefix := "memory-" + strconv.FormatInt(time.Now().UnixNano(), 10) + "-"
	return &memoryProbe{r: r, rdb: rdb, st: st, pol: pol, wl: wl, fp: fp, resp: resp, prefix: prefix}
}

// reserve reserves record i, as the server does a request's first attempt.
func (p *memoryProbe) reserve(ctx context.Context, i int) (idem.RecordID, idem.Token, error) {
	id := idem.RecordIDFor(p.pol.RecordNamespace(), p.wl.authority, p.prefix+strconv.Itoa(i))
	tok := idem.NewToken()
	res, err := p.st.Reserve(ctx, idem.Reservation{ID: id, Fingerprint: p.fp, Token: tok, Lease: p.pol.Lease,
		Retention: p.pol.Retention, LeaseExpiry: p.pol.LeaseExpiry})
	if err == nil && res.Outcome != idem.Reserved {
		err = fmt.Errorf("reserve: %v", res.Outcome)
	}
	return id, tok, err
}

// usage is Redis's MEMORY USAGE and OBJECT ENCODING of id's key.
func (p *memoryProbe) usage(ctx context.Context, id idem.RecordID) (int64, string, error) {
	n, err := p.rdb.MemoryUsage(ctx, p.st.Key(id), 0).Result()
	if err != nil {
		return 0, "", fmt.Errorf("MEMORY USAGE: %w", err)
	}
	enc, err := p.rdb.ObjectEncoding(ctx, p.st.Key(id)).Result()
	return n, enc, err
}

// usedMemory is Redis's used_memory.
func (p *memoryProbe) usedMemory(ctx context.Context) (float64, error) {
	v, err := strconv.ParseFloat(p.r.info(ctx, "memory", "used_memory"), 64)
	if err != nil {
		return 0, fmt.Errorf("INFO memory used_memory: %w", err)
	}
	return v, nil
}

// growth reserves records records, then completes them, and returns how
// much used_memory grew per record in flight and per record completed;
// it purges them after.
func (p *memoryProbe) growth(ctx context.Context, records int) (perInFlight, perCompleted float64, err error) {
	before, err := p.usedMemory(ctx)
	if err != nil {
		return 0, 0, err
	}
	ids, toks := make([]idem.RecordID, records), make([]idem.Token, records)
	for i := range records {
		if ids[i], toks[i], err = p.reserve(ctx, i); err != nil {
			return 0, 0, err
		}
	}
	mid, err := p.usedMemory(ctx)
	if err != nil {
		return 0, 0, err
	}
	for i := range records {
		if err := p.st.Complete(ctx, ids[i], toks[i], p.resp, p.pol.Retention); err != nil {
			return 0, 0, err
		}
	}
	after, err := p.usedMemory(ctx)
	if err != nil {
		return 0, 0, err
	}
	perInFlight = (mid - before) / float64(records)
	perCompleted = (after - before) / float64(records)
	for _, id := range ids {
		_ = p.st.Purge(ctx, id)
	}
	return perInFlight, perCompleted, nil
}

func (m memoryFigures) print(w io.Writer) {
	fmt.Fprintf(w, "== Redis memory per record (redis %s; the default policy; %d-byte response body, 2 stored headers)\n", m.redisVersion, m.bodyBytes)
	fmt.Fprintf(w, "  in flight: MEMORY USAGE %d bytes (%s)   target <= 200: %s\n", m.inFlight, m.inFlightEnc, verdict(float64(m.inFlight) <= 200))
	fmt.Fprintf(w, "  completed: MEMORY USAGE %d bytes (%s)   target <= 1536: %s\n", m.completed, m.completedEnc, verdict(float64(m.completed) <= 1536))
	if m.records > 0 {
		fmt.Fprintf(w, "  used_memory growth over %d records: %.0f bytes per in-flight record, %.0f per completed record\n",
			m.records, m.perInFlight, m.perCompleted)
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

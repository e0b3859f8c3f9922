// Package multiregion_test is a multi-region test bed on one machine:
// three regions on loopback, each with its own redis-server, its own
// idem-extproc daemon (in process, started from flags as the binary is)
// and its own Envoy-faithful front, the daemons reaching the other
// regions' stores through userspace WAN links the tests control (delay,
// jitter, one-way and two-way partitions, resets). One upstream stands for
// the application in every region; its effect log is the oracle.
package multiregion_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
	"github.com/idem-extproc/idem-extproc/internal/testing/redistest"
	"github.com/idem-extproc/idem-extproc/internal/testing/testwait"
)

// regionNames are the bed's regions.
var regionNames = []string{"eu", "us", "ap"}

// The policies every region runs: orders scoped by tenant, a required
// key; waits, the same whose duplicates wait for the attempt in flight
// (the shipped examples/policies.yaml's 2 s).
const ordersPolicy = `policies:
  - name: orders
    match: {methods: [POST], path: {prefix: /orders}}
    key: {required: true}
    scope: {from: header, header: x-tenant}
    lease: 3s
  - name: waits
    match: {methods: [POST], path: {prefix: /waits}}
    key: {required: true}
    scope: {from: header, header: x-tenant}
    lease: 3s
    wait_for_in_flight: 2s
`

// homesV1 places each tenant's keys in one region: t-eu-* in eu (the
// default), t-us-* in us, t-ap-* in ap.
const homesV1 = `homes:
  epoch: 1
  default: eu
  rules:
    - {scopes: ['t-us-*'], region: us}
    - {scopes: ['t-ap-*'], region: ap}
`

type bedOptions struct {
	// rtt is the round trip between two regions (half each way), jitter
	// up to this much more each way.
	rtt, jitter time.Duration
	// independent runs each region on its own store alone, no homes: the
	// negative control.
	independent bool
	// storeTimeout is each daemon's --store-timeout.
	storeTimeout time.Duration
	// persist keeps each Redis's data across a kill (append-only file).
	persist bool
	// messageTimeout and maxMessageTimeout, when set, are the filter's
	// timers (the shipped configs': 300 ms and 2.5 s) instead of the
	// harness's generous one.
	messageTimeout, maxMessageTimeout time.Duration
	// sendHome runs each daemon with --region-send-home, and each region
	// with a second front, for requests other regions send home
	// (sendhome_test.go).
	sendHome bool
}

type region struct {
	name  string
	redis *redistest.Server
	d     *daemon.Daemon
	env   *harness.Env
	// peer is the front other regions send requests home to (sendHome):
	// it keeps the home header, and has no route to another region.
	peer   *harness.Env
	config string
	logs   *harness.LogBuffer
}

type bed struct {
	t       testing.TB
	opts    bedOptions
	regions map[string]*region
	// links[from][to] carries region from's calls to region to's store.
	links map[string]map[string]*redistest.DelayLink
	up    *harness.Upstream
	// homeLinks carry requests sent home, from one region's front to
	// another's peer front, over the same WAN (sendhome_test.go).
	homeMu    sync.Mutex
	homeLinks map[string]*redistest.DelayLink
}

func newBed(t testing.TB, opts bedOptions) *bed {
	t.Helper()
	if opts.storeTimeout == 0 {
		opts.storeTimeout = time.Second
	}
	b := &bed{t: t, opts: opts, regions: map[string]*region{}, links: map[string]map[string]*redistest.DelayLink{},
		up: harness.NewUpstream()}
	t.Cleanup(b.up.Close)
	for _, name := range regionNames {
		b.regions[name] = &region{name: name, redis: redistest.Start(t, redistest.Options{Persist: opts.persist})}
	}
	for _, from := range regionNames {
		b.links[from] = map[string]*redistest.DelayLink{}
		for _, to := range regionNames {
			if from == to {
				continue
			}
			l := redistest.NewDelayLink(t, b.regions[to].redis.Addr())
			l.SetDelay(opts.rtt/2, opts.rtt/2)
			l.SetJitter(opts.jitter, opts.jitter)
			b.links[from][to] = l
		}
	}
	homes := homesV1
	if opts.independent {
		homes = ""
	}
	for _, name := range regionNames {
		b.start(name, homes)
	}
	return b
}

// start runs region name's daemon and front with a policy file holding
// homes.
func (b *bed) start(name, homes string) {
	t := b.t
	r := b.regions[name]
	r.config = filepath.Join(t.TempDir(), "policies.yaml")
	if err := os.WriteFile(r.config, []byte(ordersPolicy+homes), 0o600); err != nil {
		t.Fatal(err)
	}
	// The longest Envoy gives one message: the shipped max_message_timeout
	// with the shipped timers, else the harness's message_timeout (its
	// filter sets no max_message_timeout, so an ask is ignored and each
	// message keeps that timer).
	envoyMax := harness.TestMessageTimeout
	if b.opts.messageTimeout > 0 {
		envoyMax = max(b.opts.messageTimeout, b.opts.maxMessageTimeout)
	}
	args := []string{"--listen", "127.0.0.1:0", "--admin-listen", "", "--redis-url", r.redis.URL(),
		"--config", r.config, "--store-timeout", b.opts.storeTimeout.String(), "--envoy-max-message-timeout", envoyMax.String()}
	if !b.opts.independent {
		var others []string
		for to, l := range b.links[name] {
			others = append(others, to+"="+l.URL())
		}
		args = append(args, "--region", name, "--region-redis", strings.Join(others, " "),
			"--region-ping-interval", "200ms")
		if b.opts.sendHome {
			args = append(args, "--region-send-home", strings.Join(slices.DeleteFunc(slices.Clone(regionNames), func(n string) bool { return n == name }), ","))
		}
	}
	cfg, err := daemon.ParseConfig(args, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r.logs = &harness.LogBuffer{}
	d, err := daemon.Start(cfg, slog.New(slog.NewJSONHandler(r.logs, nil)), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Shutdown)
	r.d = d
	var filter *extprocfilterv3.ExternalProcessor
	if b.opts.messageTimeout > 0 {
		filter = envoysim.RecommendedConfig()
		filter.MessageTimeout = durationpb.New(b.opts.messageTimeout)
		filter.MaxMessageTimeout = nil
		if b.opts.maxMessageTimeout > 0 {
			filter.MaxMessageTimeout = durationpb.New(b.opts.maxMessageTimeout)
		}
	}
	front := harness.Options{ServerAddr: d.Addr(), Store: harness.OnRedis(r.redis),
		UpstreamURL: b.up.URL(), ExpectProcessingErrors: true, Filter: filter}
	if b.opts.sendHome {
		r.peer = harness.Start(t, front)
		front.FilterOptions = b.homeRoutes(name)
	}
	r.env = harness.Start(t, front)
}

// setHomes rewrites the homes section of the regions named and waits until
// each daemon holds the map of that epoch.
func (b *bed) setHomes(epoch int, homes string, names ...string) {
	t := b.t
	t.Helper()
	for _, name := range names {
		r := b.regions[name]
		if err := os.WriteFile(r.config, []byte(ordersPolicy+homes), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := r.d.Reload(); err != nil {
			t.Fatalf("%s: reload: %v", name, err)
		}
		testwait.Until(t, name+" holds epoch "+fmt.Sprint(epoch), func() bool {
			h := r.d.Policies().Homes
			return h != nil && h.Epoch == epoch
		})
	}
}

// cut holds both directions of every link into region to's store (a
// partition of that store from the other regions); heal lets them go.
func (b *bed) cut(to string, up, down bool) {
	for from, ls := range b.links {
		if l, ok := ls[to]; ok && from != to {
			l.Hold(up, down)
		}
	}
}

func (b *bed) heal(to string) {
	for from, ls := range b.links {
		if l, ok := ls[to]; ok && from != to {
			l.Release()
		}
	}
}

// answer is what a client was told for one key.
type answer struct {
	status int
	body   string
	region string
	// omitted: a replay of a record completed without its body, as when
	// the stream ended after the response headers (Idempotent-Body-Omitted).
	omitted bool
}

func answerOf(r harness.Reply, region string) answer {
	return answer{status: r.Status, body: r.Body, region: region, omitted: r.Header.Get(idem.BodyOmittedHeader) == "true"}
}

// ledger keeps every answer clients got, per key.
type ledger struct {
	mu      sync.Mutex
	answers map[string][]answer
	// bodies is each key's request body, tenants its scope.
	bodies, tenants map[string]string
}

func newLedger() *ledger {
	return &ledger{answers: map[string][]answer{}, bodies: map[string]string{}, tenants: map[string]string{}}
}

func (l *ledger) add(key string, a answer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[key] = append(l.answers[key], a)
}

// newKey is a fresh random key: a UUIDv7 (RFC 9562 §5.7), made now, when
// v7, else an order number.
func newKey(v7 bool) string {
	if v7 {
		return uuid.Must(uuid.NewV7()).String()
	}
	return "order-" + uuid.NewString()[:16]
}

// post sends one attempt of key into region r, waiting at most timeout.
func (b *bed) post(r, key, tenant, body string, timeout time.Duration) harness.Reply {
	return b.postTo(r, "/orders", key, tenant, body, timeout)
}

// postTo is post to path.
func (b *bed) postTo(r, path, key, tenant, body string, timeout time.Duration) harness.Reply {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return b.regions[r].env.DoContext(ctx, "POST", path, body, "Idempotency-Key", key, "x-tenant", tenant)
}

// oracle checks the effect log against every answer: at most one
// execution per key, and every success byte-identical to that execution's
// answer, but a replay of a record completed without its body, which
// says so (Idempotent-Body-Omitted) and has none: a stream that ends
// after the response headers completes its record that way (design.md
// §4), as a loaded machine made one of this package's tests see. It
// returns how many keys ran more than once.
func (b *bed) oracle(t testing.TB, l *ledger) (dups, executed, unanswered int) {
	t.Helper()
	effects := map[string][]harness.Effect{}
	for _, e := range b.up.Effects() {
		effects[e.Key] = append(effects[e.Key], e)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for key := range l.bodies {
		es := effects[key]
		if len(es) > 1 {
			dups++
			continue
		}
		if len(es) == 1 {
			executed++
		}
		ok := false
		for _, a := range l.answers[key] {
			if a.status < 200 || a.status > 299 {
				continue
			}
			ok = true
			if len(es) == 0 {
				t.Errorf("key %s: a success (%d from %s) with no execution", key, a.status, a.region)
			} else if a.body != es[0].ResponseBody && (!a.omitted || a.body != "") {
				t.Errorf("key %s: success from %s is not the execution's answer:\n got %q\nwant %q", key, a.region, a.body, es[0].ResponseBody)
			}
		}
		if !ok {
			unanswered++
		}
	}
	return dups, executed, unanswered
}

// counter sums the samples of metric family name in region r's registry
// whose labels include every pair of want.
func (b *bed) counter(r, name string, want map[string]string) float64 {
	b.t.Helper()
	mfs, err := b.regions[r].d.Metrics().Registry().Gather()
	if err != nil {
		b.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// statuses counts the answers clients got, by status (and problem type
// for 409 and 503).
func (l *ledger) statuses() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, as := range l.answers {
		for _, a := range as {
			k := fmt.Sprint(a.status)
			for _, p := range []string{"outcome-unknown", "request-in-progress", "idempotency-store-unavailable"} {
				if strings.Contains(a.body, p) {
					k += " " + p
				}
			}
			out[k]++
		}
	}
	return out
}

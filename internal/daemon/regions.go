package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/attempt"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/observe"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/redisstore"
	"github.com/idem-extproc/idem-extproc/internal/region"
)

// regionStores is --region-redis: the store of every other region, as
// name=URL pairs separated by white space; the flag may be repeated.
type regionStores map[string]string

func (r *regionStores) String() string {
	if r == nil {
		return ""
	}
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(*r)) {
		parts = append(parts, name+"="+(*r)[name])
	}
	return strings.Join(parts, " ")
}

func (r *regionStores) Set(v string) error {
	if *r == nil {
		*r = regionStores{}
	}
	for _, pair := range strings.Fields(v) {
		name, url, ok := strings.Cut(pair, "=")
		if !ok || name == "" || url == "" {
			return fmt.Errorf("%q is not name=redis-url", pair)
		}
		if _, dup := (*r)[name]; dup {
			return fmt.Errorf("region %q is named twice", name)
		}
		if _, err := redisstore.ParseURL(url); err != nil {
			return fmt.Errorf("region %q: %w", name, err)
		}
		(*r)[name] = url
	}
	return nil
}

// rttSamples PINGs measure a store's round trip at start, after one that
// opens the connection.
const rttSamples = 5

// probeRTT is the median round trip of rttSamples PINGs to the Redis at
// url, over a client of its own whose timeouts are not the store's budget
// (a budget too small for the round trip is what it must find).
func (d *Daemon) probeRTT(ctx context.Context, url string) (time.Duration, error) {
	probe, err := redisstore.NewSecureClient(url, 2*time.Second, d.cfg.RedisSecurity)
	if err != nil {
		return 0, err
	}
	defer probe.Close()
	if err := probe.Ping(ctx).Err(); err != nil {
		return 0, err
	}
	ds := make([]time.Duration, 0, rttSamples)
	for range rttSamples {
		start := time.Now()
		if err := probe.Ping(ctx).Err(); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// openRegions opens the other regions' stores, measures their round trips,
// and builds the router every homes map goes through. Without --region
// there is none, and a policy file with a homes section is refused.
func (d *Daemon) openRegions() error {
	if d.cfg.Region == "" {
		d.policies.AlsoCheck(needRegion)
		if err := needRegion(d.policies.Current()); err != nil {
			return fmt.Errorf("%w: --config: %w", ErrConfig, err)
		}
		return nil
	}
	names := append([]string{d.cfg.Region}, slices.Sorted(maps.Keys(d.cfg.RegionRedis))...)
	d.regionMetrics = d.metrics.Regions(names)
	stores := map[string]region.Store{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d.cfg.RedisURL != "" {
		rtt, err := d.ownRTT, d.ownRTTErr // measured when the store opened
		switch {
		case err != nil:
			d.log.Warn("own region's store does not answer; its round trip is unmeasured", slog.String("error", err.Error()))
		case rtt*2 > d.cfg.StoreTimeout:
			return fmt.Errorf("%w: --store-timeout %v is below two round trips to this region's store (measured %v)",
				ErrConfig, d.cfg.StoreTimeout, rtt)
		default:
			d.regionMetrics.RoundTrip(d.cfg.Region, rtt)
		}
	}
	stores[d.cfg.Region] = region.Store{Store: d.store, Budget: d.cfg.StoreTimeout}
	// Every region at once: each costs several of its round trips.
	opened := make([]region.Store, len(names))
	errs := make([]error, len(names))
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	push := func(f func()) { // d.cleanup, from the goroutines below
		mu.Lock()
		defer mu.Unlock()
		d.cleanup.push(f)
	}
	d.unloaded = map[string]*redisstore.Store{}
	unloaded := func(name string, st *redisstore.Store) {
		mu.Lock()
		defer mu.Unlock()
		d.unloaded[name] = st
	}
	for i, name := range names[1:] {
		wg.Go(func() {
			st, budget, err := d.openRegion(ctx, name, d.cfg.RegionRedis[name], push, unloaded)
			if err != nil {
				errs[i] = fmt.Errorf("--region-redis %s: %w", name, err)
				return
			}
			opened[i] = region.Store{Store: st, Budget: budget}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, name := range names[1:] {
		stores[name] = opened[i]
	}
	r, err := region.NewRouter(d.cfg.Region, stores, d.cfg.EnvoyMaxMessageTimeout, d.regionMetrics)
	if err != nil {
		return err
	}
	if err := r.Check(d.policies.Current().Homes); err != nil {
		return fmt.Errorf("%w: --config: %w", ErrConfig, err)
	}
	d.policies.AlsoCheck(d.checkHomes(r))
	d.router = r
	d.regionMetrics.Epoch(epochOf(d.policies.Current()))
	d.warnOutOfReach(d.policies.Current())
	d.OnReload(func(set *policy.Set, err error) {
		if err == nil {
			d.regionMetrics.Epoch(epochOf(set))
			d.warnOutOfReach(set)
		}
	})
	return nil
}

// checkHomes is the reload check of a homes map: r must reach its regions,
// and its epoch must not go back. A smaller epoch is an older map coming
// back (a stale file, a rollback done by hand): the servers would disagree
// about which map is newer.
func (d *Daemon) checkHomes(r *region.Router) func(*policy.Set) error {
	return func(set *policy.Set) error {
		if err := r.Check(set.Homes); err != nil {
			return err
		}
		if in := epochOf(d.policies.Current()); set.Homes != nil && set.Homes.Epoch < in {
			return fmt.Errorf("homes.epoch: %d is smaller than the epoch in force, %d; give every change of the map a larger epoch", set.Homes.Epoch, in)
		}
		return nil
	}
}

// warnOutOfReach names, at start and on each reload, the homes whose keys
// this server will refuse (idempotency-home-out-of-reach): their calls
// cannot fit in what Envoy grants one message.
func (d *Daemon) warnOutOfReach(set *policy.Set) {
	if far := d.router.OutOfReach(set.Homes); len(far) > 0 {
		d.log.Warn("homes this server cannot reach within Envoy's timers: their keys are refused (idempotency-home-out-of-reach); "+
			"raise the filter's max_message_timeout and --envoy-max-message-timeout, or home the scopes nearer",
			slog.String("homes", strings.Join(far, ", ")), slog.Duration("envoy_max_message_timeout", d.cfg.EnvoyMaxMessageTimeout))
	}
}

// epochOf is the epoch of set's homes map, 0 without one.
func epochOf(set *policy.Set) int {
	if set.Homes == nil {
		return 0
	}
	return set.Homes.Epoch
}

// openRegion opens one other region's store. Its round trip is measured
// over a first client; the store's client then gets the budget made of it
// and keeps connections open (MinIdleConns), so that a first write in a
// burst does not pay for a new one.
func (d *Daemon) openRegion(ctx context.Context, name, url string, push func(func()), unloaded func(string, *redisstore.Store)) (idem.Store, time.Duration, error) {
	rtt, err := d.probeRTT(ctx, url)
	answers := err == nil
	if !answers {
		// Not fatal: a region may be down when this one starts. Its calls
		// get the budget of --region-default-rtt until a restart measures
		// it.
		d.log.Warn("region's store does not answer at start; budget from --region-default-rtt", slog.String("region", name),
			slog.String("error", err.Error()))
		rtt = d.cfg.RegionDefaultRTT
	}
	budget := region.RemoteBudget(d.cfg.StoreTimeout, rtt)
	rdb, err := redisstore.NewRemoteClient(url, budget, d.cfg.RedisSecurity, d.cfg.RegionIdleConns)
	if err != nil {
		return nil, 0, err
	}
	push(func() { _ = rdb.Close() })
	opts := d.batchingAt(rtt, answers, name)
	opts.CallTimeout = budget
	opts.Logger = d.log.With(slog.String("region", name))
	st := redisstore.New(rdb, opts)
	push(func() { _ = st.Close() })
	loaded := false
	if answers { // else nothing to load the scripts into yet
		err := st.LoadScripts(ctx)
		d.regionMetrics.ScriptsLoaded(name, err)
		if err != nil {
			d.log.Warn("region's store scripts not loaded; loading them again in the background, and until then "+
				"its calls pay one more round trip", slog.String("region", name), slog.String("error", err.Error()))
		}
		loaded = err == nil
	}
	if !loaded {
		unloaded(name, st)
	}
	d.regionMetrics.RoundTrip(name, rtt)
	d.log.Info("region's store", slog.String("region", name), slog.Duration("rtt", rtt), slog.Duration("budget", budget))
	return st, budget, nil
}

// needRegion refuses a homes map on a server that does not know its region.
func needRegion(set *policy.Set) error {
	if set.Homes != nil {
		return errors.New("homes: the file places scopes in regions, and this server has no --region (and --region-redis for the others)")
	}
	return nil
}

// keepRegionsWarm pings every region's store each --region-ping-interval,
// and loads the scripts that did not load at start.
func (d *Daemon) keepRegionsWarm(ctx context.Context) {
	if d.router == nil {
		return
	}
	go d.router.KeepWarm(ctx, d.cfg.RegionPingInterval, d.regionMetrics.RoundTrip)
	for name, st := range d.unloaded {
		go d.loadScripts(ctx, name, st)
	}
}

// loadScripts loads the store's scripts into region name's Redis, trying
// again each --region-ping-interval until they are loaded or ctx ends: a
// region whose Redis was down, or slow, at start gets them once it
// answers. Each try is bounded as the loads at start are.
func (d *Daemon) loadScripts(ctx context.Context, name string, st *redisstore.Store) {
	every(ctx, d.cfg.RegionPingInterval, func() bool {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := st.LoadScripts(lctx)
		cancel()
		if ctx.Err() != nil {
			return false
		}
		d.regionMetrics.ScriptsLoaded(name, err)
		if err == nil {
			d.log.Info("region's store scripts loaded", slog.String("region", name))
		}
		return err != nil
	})
}

var _ region.Observer = (*observe.Regions)(nil)

// homes is the ext_proc server's home finder: the router, or none.
func (d *Daemon) homes() attempt.HomeFinder {
	if d.router == nil {
		return nil
	}
	return d.router
}

// batchingAt is how the calls to a Redis whose round trip is rtt
// (measured, when known) are batched: as --redis-batch-slots says, or,
// when it is 0 (automatic), by rtt (redisstore.BatchingFor).
func (d *Daemon) batchingAt(rtt time.Duration, known bool, region string) redisstore.Options {
	if d.cfg.RedisBatchSlots > 0 {
		return redisstore.Options{BatchSlots: d.cfg.RedisBatchSlots}
	}
	if !known {
		rtt = 0 // batching costs a lone caller nothing
	}
	opts := redisstore.BatchingFor(rtt)
	attrs := []any{slog.Duration("rtt", rtt), slog.Bool("batched", !opts.Unbatched), slog.Int("batch_slots", opts.BatchSlots)}
	if region != "" {
		attrs = append(attrs, slog.String("region", region))
	}
	d.log.Info("redis calls batching, by the measured round trip", attrs...)
	return opts
}

// Package rotated follows files that change under a running server (a
// rotated Kubernetes Secret, a cert-manager renewal, a new key ring): a
// value loaded from them is loaded again when one of their modification
// times changes, looked at no more than once per interval. A reload that
// fails keeps the previous value, and the broken files are not read again
// until they change once more. The TLS listener (tlsfiles), the Redis
// client certificate (redisstore) and the key ring (seal) all follow their
// files through it.
//
// The policy file is not: config.Source reloads it as soon as its
// directory changes (fsnotify), because a reload there is reported
// (metrics, logs) and a request must not pay for it.
package rotated

import (
	"os"
	"slices"
	"sync"
	"time"
)

// Options configures a Value.
type Options[T any] struct {
	// Every bounds how often Current looks at the files' modification
	// times; every call when zero.
	Every time.Duration
	// OnReload, when set, is told the outcome of each reload after the
	// first load: the new value, or the error (the previous value stays).
	OnReload func(v T, err error)
}

// Value is what load made of paths, loaded again when they change.
type Value[T any] struct {
	paths []string
	load  func() (T, error)
	opts  Options[T]

	mu        sync.Mutex
	cur       T
	mtimes    []time.Time
	lastCheck time.Time
}

// Load loads the value once; its error is load's. Empty paths are skipped
// (an optional file not configured).
func Load[T any](paths []string, load func() (T, error), opts Options[T]) (*Value[T], error) {
	v := &Value[T]{paths: paths, load: load, opts: opts}
	v.mtimes = v.modTimes()
	cur, err := load()
	if err != nil {
		return nil, err
	}
	v.cur = cur
	return v, nil
}

// modTimes stats every path; a file that cannot be stat'ed counts as the
// zero time, so that its return counts as a change.
func (v *Value[T]) modTimes() []time.Time {
	m := make([]time.Time, len(v.paths))
	for i, p := range v.paths {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			m[i] = fi.ModTime()
		}
	}
	return m
}

// Current returns the value in force, first loading it again if the files
// changed since the last look (at most once per Options.Every).
func (v *Value[T]) Current() T {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := time.Now()
	if v.opts.Every > 0 && now.Sub(v.lastCheck) < v.opts.Every {
		return v.cur
	}
	v.lastCheck = now
	m := v.modTimes()
	if slices.EqualFunc(m, v.mtimes, time.Time.Equal) {
		return v.cur
	}
	// Record the times whatever the outcome: broken files are not read
	// again until they change.
	v.mtimes = m
	cur, err := v.load()
	if err == nil {
		v.cur = cur
	}
	if v.opts.OnReload != nil {
		v.opts.OnReload(cur, err)
	}
	return v.cur
}

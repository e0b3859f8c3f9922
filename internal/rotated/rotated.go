// Package rotated follows files that change under a running server (a
// rotated Kubernetes Secret, a cert-manager renewal, a new key ring): a
// value loaded from them is loaded again when one of them changes (its
// modification time, size, or the file a path names), looked at no more
// than once per interval. A reload that
// fails keeps the previous value, and the broken files are not read again
// until they change once more. The TLS listener (tlsfiles), the Redis
// client certificate (redisstore), the key ring (seal) and the admin
// token (admin) all follow their files through it.
//
// The policy file is not: config.Source reloads it as soon as its
// directory changes (fsnotify), because a reload there is reported
// (metrics, logs) and a request must not pay for it.
package rotated

import (
	"io/fs"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Value.
type Options[T any] struct {
	// Every bounds how often Current looks at the files; every call when
	// zero.
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
	stats     []fs.FileInfo
	lastCheck time.Time
	// told is OnReload's listener.
	told atomic.Pointer[func(error)]
}

// OnReload has f told the outcome of every reload from now on, before
// Options.OnReload: for a listener that comes after the first load (the
// daemon counts the reloads of the files it configured).
func (v *Value[T]) OnReload(f func(err error)) { v.told.Store(&f) }

// Load loads the value once; its error is load's. Empty paths are skipped
// (an optional file not configured).
func Load[T any](paths []string, load func() (T, error), opts Options[T]) (*Value[T], error) {
	v := &Value[T]{paths: paths, load: load, opts: opts}
	v.stats = v.stat()
	cur, err := load()
	if err != nil {
		return nil, err
	}
	v.cur = cur
	return v, nil
}

// stat stats every path; a file that cannot be stat'ed is nil, so that
// its return counts as a change.
func (v *Value[T]) stat() []fs.FileInfo {
	m := make([]fs.FileInfo, len(v.paths))
	for i, p := range v.paths {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			m[i] = fi
		}
	}
	return m
}

// same reports whether a and b describe one unchanged file. The
// modification time alone misses a file renamed over another within one
// tick of the clock Linux stamps files with ("any change that happens
// within that jiffy will end up with the same timestamp": torvalds/linux,
// Documentation/filesystems/multigrain-ts.rst).
func same(a, b fs.FileInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
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
	m := v.stat()
	if slices.EqualFunc(m, v.stats, same) {
		return v.cur
	}
	// Record what was seen whatever the outcome: broken files are not read
	// again until they change.
	v.stats = m
	cur, err := v.load()
	if err == nil {
		v.cur = cur
	}
	if f := v.told.Load(); f != nil {
		(*f)(err)
	}
	if v.opts.OnReload != nil {
		v.opts.OnReload(cur, err)
	}
	return v.cur
}

package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Source holds the policies in force. Without a file it holds the built-in
// default; with one, Reload and Watch replace the policies atomically when
// the file changes and validates, and keep the old ones when it does not.
// Streams read the set once, when they start, so a reload never changes
// the rules of a request in progress.
type Source struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[policy.Set]

	mu  sync.Mutex // serialises reloads
	sum [sha256.Size]byte
	// OnReload, when set before Watch, is told the outcome of every reload
	// that found the file changed.
	OnReload func(err error)
	// check, when set, vets a parsed set against the server's own setup
	// (a policy asking for encryption needs a key ring).
	check func(*policy.Set) error
}

// NewSource loads path, or the default policy when path is empty. The
// first load must succeed: a server never starts on a broken file. check,
// when not nil, must accept every set loaded, at start and on reload.
func NewSource(path string, log *slog.Logger, check func(*policy.Set) error) (*Source, error) {
	s := &Source{path: path, log: log, check: check}
	if path == "" {
		s.cur.Store(policy.DefaultSet())
		return s, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	set, err := s.parse(data)
	if err != nil {
		return nil, err
	}
	s.cur.Store(set)
	s.sum = sha256.Sum256(data)
	return s, nil
}

func (s *Source) parse(data []byte) (*policy.Set, error) {
	set, err := Parse(s.path, data)
	if err == nil && s.check != nil {
		if err = s.check(set); err != nil {
			err = fmt.Errorf("%s: %w", s.path, err)
		}
	}
	return set, err
}

// Current returns the policies in force.
func (s *Source) Current() *policy.Set { return s.cur.Load() }

// Path returns the configuration file, or "".
func (s *Source) Path() string { return s.path }

// Reload reads the file again. A file that does not validate is rejected:
// the error is returned and logged, and the policies in force stay.
func (s *Source) Reload() error {
	if s.path == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path)
	if err == nil {
		sum := sha256.Sum256(data)
		if bytes.Equal(sum[:], s.sum[:]) {
			return nil // touched, not changed
		}
		var set *policy.Set
		if set, err = s.parse(data); err == nil {
			s.cur.Store(set)
			s.sum = sum
			s.log.Info("configuration reloaded", slog.String("config", s.path), slog.Int("policies", len(set.Policies)))
		}
	}
	if err != nil {
		s.log.Error("configuration reload rejected; the previous configuration stays in force",
			slog.String("config", s.path), slog.String("error", err.Error()))
	}
	if s.OnReload != nil {
		s.OnReload(err)
	}
	return err
}

// Watch reloads the file whenever its directory changes, until ctx ends.
// It watches the directory, not the file, so that editors' atomic renames
// and Kubernetes ConfigMap updates (a "..data" symlink swap) are seen.
func (s *Source) Watch(ctx context.Context) error {
	if s.path == "" {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config watch: %w", err)
	}
	if err := w.Add(filepath.Dir(s.path)); err != nil {
		w.Close()
		return fmt.Errorf("config watch: %w", err)
	}
	go func() {
		defer w.Close()
		// Changes come in bursts (truncate, write, chmod; or several
		// renames): reload once the burst settles.
		const settle = 100 * time.Millisecond
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case _, ok := <-w.Events:
				if !ok {
					return
				}
				timer.Reset(settle)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				s.log.Warn("config watch error", slog.String("error", err.Error()))
			case <-timer.C:
				_ = s.Reload()
			}
		}
	}()
	return nil
}

package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
)

// Source holds the policies in force. Without a file it holds the built-in
// default; with one, Reload and Watch replace the policies atomically when
// the file changes and validates, and keep the old ones when it does not.
// Streams read the set once, when they start, so a reload never changes
// the rules of a request in progress.
//
// A file is read only once stable (readStable: the same bytes twice, Settle
// apart), and refused when it looks cut short: empty, a key without a
// value, a second document, nothing protected without `policies: []`
// (Parse). A cut at a line boundary can still leave a valid smaller file;
// a file that ends with the line "..." (endMarker) rules that out: once the
// file in force ends with it, a file without it is refused.
type Source struct {
	path string
	log  *slog.Logger
	cur  atomic.Pointer[policy.Set]

	mu  sync.Mutex // serialises reloads
	sum [sha256.Size]byte
	// ended: the file in force ends with endMarker, so a new file must too.
	ended bool
	// Settle is how long a file must stay unchanged before it is read as
	// complete (readStable); stableFor by default. Set it before the first
	// Reload or Watch.
	Settle time.Duration
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
	s := &Source{path: path, log: log, check: check, Settle: stableFor}
	if path == "" {
		s.cur.Store(policy.DefaultSet())
		return s, nil
	}
	data, err := s.readStable()
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	set, sh, err := s.parse(data)
	if err != nil {
		return nil, err
	}
	s.cur.Store(set)
	s.sum = sha256.Sum256(data)
	s.ended = sh.ended
	return s, nil
}

func (s *Source) parse(data []byte) (*policy.Set, shape, error) {
	set, sh, err := parse(s.path, data)
	if err == nil && s.check != nil {
		if err = s.check(set); err != nil {
			err = fmt.Errorf("%s: %w", s.path, err)
		}
	}
	return set, sh, err
}

// stableFor is how long a policy file must stay the same before it is
// read: see readStable.
const stableFor = 50 * time.Millisecond

// stableTries bounds readStable: a file still changing after this many
// reads is refused for now (the watcher reads it again on its next change).
const stableTries = 20

// readStable reads the file until two reads Settle apart return the same
// bytes, so that a file being rewritten in place (truncated, then written
// in pieces) is not read half way. It cannot see a writer that stopped
// half way (a crash, a full disk): that file is stable, and is caught only
// if it does not validate or lacks the end marker (Reload).
func (s *Source) readStable() ([]byte, error) {
	prev, err := safefile.Read(s.path, maxPolicyFile)
	if err != nil {
		return nil, err
	}
	for range stableTries {
		time.Sleep(s.Settle)
		data, err := safefile.Read(s.path, maxPolicyFile)
		if err != nil {
			return nil, err
		}
		if bytes.Equal(data, prev) {
			return data, nil
		}
		prev = data
	}
	return nil, fmt.Errorf("%s: still changing after %d reads %s apart; not read", s.path, stableTries+1, s.Settle)
}

// Current returns the policies in force.
func (s *Source) Current() *policy.Set { return s.cur.Load() }

// AlsoCheck adds a check every later reload must pass too, for what can be
// judged only once the server holds more than the file (the store's
// capabilities). Call it before Watch or Reload run.
func (s *Source) AlsoCheck(check func(*policy.Set) error) {
	if prev := s.check; prev != nil {
		s.check = func(set *policy.Set) error {
			if err := prev(set); err != nil {
				return err
			}
			return check(set)
		}
		return
	}
	s.check = check
}

// Path returns the configuration file, or "".
func (s *Source) Path() string { return s.path }

// Reload reads the file again once it is stable. A file that does not
// validate, is still changing, or lacks the end marker that the file in
// force has, is rejected: the error is returned and logged, OnReload is
// told, and the policies in force stay.
func (s *Source) Reload() error {
	if s.path == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := s.readStable()
	if err == nil {
		sum := sha256.Sum256(data)
		if bytes.Equal(sum[:], s.sum[:]) {
			return nil // touched, not changed
		}
		var set *policy.Set
		var sh shape
		if set, sh, err = s.parse(data); err == nil && s.ended && !sh.ended {
			err = fmt.Errorf("%s: does not end with the line %q, as the configuration in force does: "+
				"taken for a truncated copy and refused (to stop using the marker, remove it and restart)", s.path, endMarker)
		}
		if err == nil {
			s.cur.Store(set)
			s.sum = sum
			s.ended = sh.ended
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

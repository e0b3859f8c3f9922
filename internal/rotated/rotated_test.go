package rotated

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// touch writes content with a modification time of its own (the file
// system's clock may not tick between two writes).
func touch(t *testing.T, path, content string, at time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

// TestFollowsChanges: a changed file is loaded again; one that does not
// load keeps the previous value and is not read again until it changes;
// an unchanged file is not read at all.
func TestFollowsChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	at := time.Now()
	touch(t, path, "one", at)
	loads := 0
	var reloaded []error
	v, err := Load([]string{path, ""}, func() (string, error) {
		loads++
		b, err := os.ReadFile(path)
		if string(b) == "broken" {
			return "", errors.New("broken")
		}
		return string(b), err
	}, Options[string]{OnReload: func(_ string, err error) { reloaded = append(reloaded, err) }})
	if err != nil {
		t.Fatal(err)
	}
	if got := v.Current(); got != "one" || loads != 1 {
		t.Fatalf("Current = %q after %d loads, want one after 1", got, loads)
	}
	touch(t, path, "two", at.Add(time.Second))
	if got := v.Current(); got != "two" || loads != 2 {
		t.Fatalf("after a change: %q after %d loads", got, loads)
	}
	touch(t, path, "broken", at.Add(2*time.Second))
	if got := v.Current(); got != "two" {
		t.Fatalf("a broken file replaced the value: %q", got)
	}
	if got := v.Current(); got != "two" || loads != 3 {
		t.Fatalf("the broken file was read again: %q after %d loads, want 3", got, loads)
	}
	touch(t, path, "three", at.Add(3*time.Second))
	if got := v.Current(); got != "three" {
		t.Fatalf("after a repair: %q", got)
	}
	if len(reloaded) != 3 || reloaded[0] != nil || reloaded[1] == nil || reloaded[2] != nil {
		t.Fatalf("OnReload saw %v, want nil, an error, nil", reloaded)
	}
}

// TestEveryBoundsTheLooks: within Options.Every of the last look, a change
// is not seen yet.
func TestEveryBoundsTheLooks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	at := time.Now()
	touch(t, path, "one", at)
	v, err := Load([]string{path}, func() (string, error) {
		b, err := os.ReadFile(path)
		return string(b), err
	}, Options[string]{Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	_ = v.Current() // the first look
	touch(t, path, "two", at.Add(time.Second))
	if got := v.Current(); got != "one" {
		t.Fatalf("looked again within Every: %q", got)
	}
}

func TestLoadError(t *testing.T) {
	want := errors.New("no")
	if _, err := Load([]string{"x"}, func() (int, error) { return 0, want }, Options[int]{}); !errors.Is(err, want) {
		t.Fatalf("Load = %v, want %v", err, want)
	}
}

// TestRenameWithinOneTick: a file renamed over the one loaded is loaded
// again even when both bear the same modification time, as two files
// written within one tick of the kernel's coarse clock do.
func TestRenameWithinOneTick(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	at := time.Now()
	touch(t, path, "one", at)
	v, err := Load([]string{path}, func() (string, error) {
		b, err := os.ReadFile(path)
		return string(b), err
	}, Options[string]{})
	if err != nil {
		t.Fatal(err)
	}
	touch(t, filepath.Join(dir, "new"), "two", at)
	if err := os.Rename(filepath.Join(dir, "new"), path); err != nil {
		t.Fatal(err)
	}
	if got := v.Current(); got != "two" {
		t.Fatalf("after a rename at the same time: %q, want two", got)
	}
}

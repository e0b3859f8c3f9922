package config

import (
	"bytes"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestCutFilesAreRefused: what an in-place rewrite caught half way leaves
// behind is refused, each with a line naming the file.
func TestCutFilesAreRefused(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"", "c.yaml: the file is empty"},
		{"\n\n", "c.yaml: the file is empty"},
		{"# only a comment\n", "c.yaml: the file is empty"},
		{"---\n", "c.yaml: the file holds no settings"},
		{"policies:\n", "c.yaml:1: policies: no value"},
		{"policies:\n  - name: a\n    match:\n", "c.yaml:3: policies[0].match: no value"},
		{"policies:\n  - name: a\n    match: {methods: [POST]}\n    key:\n", "c.yaml:4: policies[0].key: no value"},
		{"policies:\n  - name: a\n    match: {methods: [POST]}\n  -\n", "c.yaml:4: policies[1]: no value"},
		{"defaults:\n  retention:\n", "c.yaml:2: defaults.retention: no value"},
		{"policies: []\n---\npolicies: []\n", "c.yaml:2: a second YAML document"},
		{"default_policy: {enabled: false}\n", "would protect nothing; write `policies: []` to mean it"},
	} {
		_, err := Parse("c.yaml", []byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
	// Said explicitly, protecting nothing is allowed.
	set, err := Parse("c.yaml", []byte("policies: []\ndefault_policy: {enabled: false}\n"))
	if err != nil || len(set.Policies) != 0 {
		t.Fatalf("explicit empty: %v %+v", err, set)
	}
}

// markedFiles returns two different valid policy files, both ending with
// the end marker: the example, and the example with its payments policy
// renamed and its defaults' retention changed.
func markedFiles(t *testing.T) (old, new []byte) {
	t.Helper()
	b, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	old = append(bytes.TrimRight(b, "\n"), "\n...\n"...)
	new = bytes.Replace(old, []byte("- name: payments"), []byte("- name: payments-v2"), 1)
	new = bytes.Replace(new, []byte("retention: 24h"), []byte("retention: 36h"), 1)
	if bytes.Equal(old, new) {
		t.Fatal("the example changed: the replacements found nothing")
	}
	return old, new
}

func parsed(t *testing.T, data []byte) any {
	t.Helper()
	set, err := Parse("p.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestEveryPrefixOfAMarkedFileIsRefusedOrWhole is the property behind the
// end marker: over a Source whose file in force ends with it, writing any
// prefix of another marked file (what a reader can see of an in-place
// rewrite at any moment) leaves either the old policies or exactly the new
// ones in force, never a third set. The cuts tried are every line boundary
// (where a cut leaves valid YAML most often), a byte either side of each,
// and a fixed pseudo-random sample of the rest.
func TestEveryPrefixOfAMarkedFileIsRefusedOrWhole(t *testing.T) {
	old, new := markedFiles(t)
	oldSet, newSet := parsed(t, old), parsed(t, new)
	if !reflect.DeepEqual(parsed(t, old), oldSet) || reflect.DeepEqual(oldSet, newSet) {
		t.Fatal("sets do not compare as the test needs")
	}
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := NewSource(path, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Settle = 0 // one writer, which waits for each Reload: every read is stable
	applied := 0
	for _, n := range cuts(new) {
		if err := os.WriteFile(path, new[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		err := s.Reload()
		got := any(s.Current())
		switch {
		case reflect.DeepEqual(got, oldSet):
			if err == nil && n > 0 {
				t.Fatalf("prefix %d: accepted but the old set stays", n)
			}
		case reflect.DeepEqual(got, newSet):
			if applied == 0 {
				applied = n
			}
		default:
			t.Fatalf("prefix of %d bytes (of %d) applied a third policy set; it ends %q", n, len(new), new[max(0, n-40):n])
		}
		if got != any(s.Current()) {
			t.Fatal("Current changed without a Reload")
		}
		// Go back to the old file for the next prefix.
		if reflect.DeepEqual(got, newSet) {
			if err := os.WriteFile(path, old, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := s.Reload(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Only the whole file (or the whole file less its last newline, whose
	// last line still is the marker) is applied.
	if applied < len(new)-1 {
		t.Fatalf("first applied prefix: %d bytes of %d", applied, len(new))
	}
}

// cuts returns the prefix lengths TestEveryPrefixOfAMarkedFileIsRefusedOrWhole
// tries, in increasing order.
func cuts(b []byte) []int {
	seen := map[int]bool{0: true, len(b): true, len(b) - 1: true}
	for i, c := range b {
		if c == '\n' {
			seen[i], seen[i+1], seen[min(i+2, len(b))] = true, true, true
		}
	}
	r := rand.New(rand.NewPCG(15, 15))
	for range 300 {
		seen[r.IntN(len(b)+1)] = true
	}
	out := make([]int, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// TestWithoutTheMarkerLineCutsCanPass documents the limit of the checks
// without the end marker: a cut at a line boundary can leave a smaller
// valid file, which is applied once stable. The marker exists for this.
func TestWithoutTheMarkerLineCutsCanPass(t *testing.T) {
	doc := "policies:\n  - name: a\n    match: {methods: [POST]}\n  - name: b\n    match: {methods: [PUT]}\n"
	cut := doc[:strings.Index(doc, "  - name: b")]
	set, err := Parse("p.yaml", []byte(cut))
	if err != nil || len(set.Policies) != 2 { // a, and the default policy
		t.Fatalf("cut = %v, %d policies", err, len(set.Policies))
	}
}

// TestMarkerIsSticky: once the file in force ends with the marker, a file
// without it is refused and the old set stays; a new marked file is
// applied.
func TestMarkerIsSticky(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("defaults: {retention: 2h}\n")
	s, err := NewSource(path, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Settle = 0
	write("defaults: {retention: 3h}\n...\n")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	write("defaults: {retention: 4h}\n")
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), `does not end with the line "..."`) {
		t.Fatalf("unmarked after marked: %v", err)
	}
	if r := s.Current().Policies[0].Retention.String(); r != "3h0m0s" {
		t.Fatalf("in force: %s", r)
	}
	write("defaults: {retention: 5h}\n   ...\n") // indented: a value, not the marker
	if err := s.Reload(); err == nil {
		t.Fatal("an indented ... passed for the marker")
	}
	write("defaults: {retention: 5h}\n...\n")
	if err := s.Reload(); err != nil || s.Current().Policies[0].Retention.String() != "5h0m0s" {
		t.Fatalf("marked again: %v", err)
	}
}

// watched starts a Source on path with its watcher and returns it with a
// channel that receives the outcome of each reload the watcher made.
func watched(t *testing.T, path string) (*Source, <-chan error) {
	t.Helper()
	s, err := NewSource(path, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	reloads := make(chan error, 100)
	s.OnReload = func(err error) { reloads <- err }
	if err := s.Watch(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s, reloads
}

// TestWatchRefusesAFileEmptiedInPlace: `> policies.yaml` (truncate in
// place, as a shell or many editors do) is a rejected reload, and the
// policies in force stay until the file is written whole again.
func TestWatchRefusesAFileEmptiedInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("defaults: {retention: 2h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, reloads := watched(t, path)
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-reloads; err == nil || !strings.Contains(err.Error(), "the file is empty") {
		t.Fatalf("reload of the emptied file: %v", err)
	}
	if r := s.Current().Policies[0].Retention.String(); r != "2h0m0s" {
		t.Fatalf("in force after the rejection: retention %s", r)
	}
	if err := os.WriteFile(path, []byte("defaults: {retention: 3h}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for err := range reloads {
		if err == nil {
			break
		}
	}
	if r := s.Current().Policies[0].Retention.String(); r != "3h0m0s" {
		t.Fatalf("in force after the rewrite: retention %s", r)
	}
}

// TestWatchFollowsConfigMapSwaps: a Kubernetes ConfigMap volume holds
// ..<timestamp>/ directories, a ..data symlink to the current one, and
// the file as a symlink through ..data; an update writes a new directory
// and renames a new ..data symlink over the old one (kubernetes/kubernetes
// pkg/volume/util/atomic_writer.go, AtomicWriter.Write steps 5-9). The watcher sees
// the swap and loads the new file.
func TestWatchFollowsConfigMapSwaps(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "policy.yaml"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_12_01_08_00_00.1", "defaults: {retention: 2h}\n")
	path := filepath.Join(dir, "policy.yaml")
	if err := os.Symlink(filepath.Join("..data", "policy.yaml"), path); err != nil {
		t.Fatal(err)
	}
	s, reloads := watched(t, path)
	version("..2026_12_01_08_01_00.2", "defaults: {retention: 3h}\n")
	if err := <-reloads; err != nil {
		t.Fatal(err)
	}
	if r := s.Current().Policies[0].Retention.String(); r != "3h0m0s" {
		t.Fatalf("after the swap: retention %s", r)
	}
	// A swap to a version that does not validate is refused.
	version("..2026_12_01_08_02_00.3", "")
	if err := <-reloads; err == nil {
		t.Fatal("an empty ConfigMap version was applied")
	}
	if r := s.Current().Policies[0].Retention.String(); r != "3h0m0s" {
		t.Fatalf("after the refused swap: retention %s", r)
	}
}

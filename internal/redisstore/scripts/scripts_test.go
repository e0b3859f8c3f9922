package scripts

import (
	"strings"
	"testing"
)

// TestEverySource: every embedded file is a script Source returns whole,
// behind the record library (after its flags line, if it has one), and a
// name without a file is "".
func TestEverySource(t *testing.T) {
	entries, err := files.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 9 {
		t.Fatalf("%d scripts embedded", len(entries))
	}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".lua")
		b, _ := files.ReadFile(e.Name())
		want := library + string(b)
		if first, rest, ok := strings.Cut(string(b), "\n"); ok && strings.HasPrefix(first, "#!") {
			want = first + "\n" + library + rest
		}
		if src := Source(name); src == "" || src != want {
			t.Errorf("Source(%q) is not the library and %s", name, e.Name())
		}
	}
	if Source("nonesuch") != "" {
		t.Error(`Source("nonesuch") is not ""`)
	}
}

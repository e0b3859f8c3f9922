package scripts

import (
	"strings"
	"testing"
)

// TestEverySource: every embedded file is a script Source returns whole,
// and a name without a file is "".
func TestEverySource(t *testing.T) {
	entries, err := files.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 10 {
		t.Fatalf("%d scripts embedded", len(entries))
	}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".lua")
		b, _ := files.ReadFile(e.Name())
		if src := Source(name); src == "" || src != string(b) {
			t.Errorf("Source(%q) is not %s", name, e.Name())
		}
	}
	if Source("nonesuch") != "" {
		t.Error(`Source("nonesuch") is not ""`)
	}
}

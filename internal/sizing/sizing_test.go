package sizing

import (
	"slices"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
)

// TestEstimate: records are the rate times the retention, bytes the
// records times the figure of the policy's mode, plus the envelope when
// it seals.
func TestEstimate(t *testing.T) {
	p := policy.Default()
	p.Retention = time.Hour
	r := Estimate(p, 10)
	if r.Mode != Auto || r.Records != 36000 || r.Bytes["object"] != 36000*PerRecord["object"][Auto] {
		t.Fatalf("builtin: %+v", r)
	}
	p.Compression.Dictionary = "orders.zdict"
	p.Encrypt = true
	if r := Estimate(p, 10); r.Mode != Trained || r.Bytes["list"] != 36000*(PerRecord["list"][Trained]+sealOverhead) {
		t.Fatalf("trained, sealed: %+v", r)
	}
	p.Compression.Mode = compress.Off
	if r := Estimate(p, 0); r.Mode != Uncompressed || r.Records != 0 {
		t.Fatalf("off: %+v", r)
	}
	for b, want := range map[float64]string{512: "512 B", 1536: "1.5 KiB", 3 << 30: "3.0 GiB"} {
		if got := Human(b); got != want {
			t.Errorf("Human(%v) = %q, want %q", b, got, want)
		}
	}
}

// TestClassesAreTheCorpus: the table's classes are the generator's, by
// name and in order, so that each figure is of the answers its column
// names.
func TestClassesAreTheCorpus(t *testing.T) {
	var names []Class
	for _, c := range corpus.Classes {
		names = append(names, Class(c))
	}
	if !slices.Equal(names, Classes) {
		t.Fatalf("sizing.Classes %v, corpus.Classes %v", Classes, corpus.Classes)
	}
}

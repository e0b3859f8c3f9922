package config

import (
	"strings"
	"testing"
)

// TestSizesTakeKubernetesUnits: max_request_body and max_stored_body
// accept Ki, Mi and Gi, as Kubernetes quantities are written, meaning the
// same as KiB, MiB and GiB; a duration written in days says how to write it.
func TestSizesTakeKubernetesUnits(t *testing.T) {
	set, err := Parse("units.yaml", []byte("defaults:\n  max_request_body: 2Mi\n  max_stored_body: 512Ki\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := set.Policies[0]
	if p.MaxRequestBody != 2<<20 || p.MaxStoredBody != 512<<10 {
		t.Fatalf("sizes %d, %d", p.MaxRequestBody, p.MaxStoredBody)
	}
	if set, err = Parse("units.yaml", []byte("defaults:\n  max_request_body: 1Gi\n")); err != nil || set.Policies[0].MaxRequestBody != 1<<30 {
		t.Fatalf("1Gi: %v", err)
	}
	_, err = Parse("units.yaml", []byte("defaults:\n  retention: 7d\n"))
	if err == nil || !strings.Contains(err.Error(), "write 7 days as 168h") {
		t.Fatalf("7d: %v", err)
	}
	_, err = Parse("units.yaml", []byte("defaults:\n  max_stored_body: 1M\n"))
	if err == nil || !strings.Contains(err.Error(), "Ki, Mi, Gi") {
		t.Fatalf("1M: %v", err)
	}
}

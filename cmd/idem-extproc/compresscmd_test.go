package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/testing/corpus"
)

// TestCompressTrain: a dictionary trained from `curl -si`-like samples
// loads as a policy's compression.dictionary, compresses that route's
// answers smaller than the built-in dictionary, and expands them back.
func TestCompressTrain(t *testing.T) {
	dir := t.TempDir()
	samples := filepath.Join(dir, "samples")
	if err := os.Mkdir(samples, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, r := range corpus.New(11).Answers(corpus.Object, 300) {
		var b bytes.Buffer
		fmt.Fprintf(&b, "HTTP/1.1 %d OK\r\n", r.Status)
		for _, h := range r.Headers {
			fmt.Fprintf(&b, "%s: %s\r\n", h.Name, h.Value)
		}
		fmt.Fprintf(&b, "Date: Tue, 01 Dec 2026 10:00:00 GMT\r\nContent-Length: %d\r\n\r\n%s", len(r.Body), r.Body)
		if err := os.WriteFile(filepath.Join(samples, fmt.Sprintf("%03d.http", i)), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dict := filepath.Join(dir, "orders.zdict")
	var stdout, stderr bytes.Buffer
	args := []string{"compress", "train", "--id", "40500", "--out", dict, samples}
	if code := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "dictionary 40500") || !strings.Contains(stdout.String(), "trained on 300 answers") {
		t.Fatalf("stdout %q", stdout.String())
	}
	pf := filepath.Join(dir, "policies.yaml")
	if err := os.WriteFile(pf, []byte("defaults:\n  compression: {dictionary: orders.zdict}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	set, err := config.Load(pf)
	if err != nil {
		t.Fatal(err)
	}
	trained := set.Policies[0].Compression.Codec
	builtin, err := config.Parse("builtin.yaml", []byte("defaults: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var withDict, without int
	for _, r := range corpus.New(12).Answers(corpus.Object, 50) {
		z := trained.Compress(r)
		withDict += len(z.Body)
		without += len(builtin.Policies[0].Compression.Codec.Compress(r).Body)
		back, err := trained.Expand(z, 1<<20)
		if err != nil || string(back.Body) != string(r.Body) || len(back.Headers) != len(r.Headers) {
			t.Fatalf("expand: %v", err)
		}
	}
	if withDict >= without*9/10 {
		t.Fatalf("trained dictionary: %d bytes, built-in %d", withDict, without)
	}

	// A sample that says it is HTTP and is not, and a bad id, are refused.
	if err := os.WriteFile(filepath.Join(samples, "broken.http"), []byte("HTTP/1.1 two hundred\r\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "broken.http: not an HTTP response") {
		t.Fatalf("broken sample: exit %d %q", code, stderr.String())
	}
}

package config

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// TestAlsoCheckHoldsOnReload: a check added once the server knows more than
// the file (the daemon adds the store's capabilities) refuses a reload, and
// the policies in force stay.
func TestAlsoCheckHoldsOnReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("policies:\n- name: orders\n  match: {path: {prefix: /orders}}\n")
	s, err := NewSource(path, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Settle = 0
	refused := errors.New("refused by the added check")
	s.AlsoCheck(func(set *policy.Set) error {
		for _, p := range set.Policies {
			if p.Name == "waits" {
				return refused
			}
		}
		return nil
	})
	write("policies:\n- name: waits\n  match: {path: {prefix: /orders}}\n")
	if err := s.Reload(); !errors.Is(err, refused) {
		t.Fatalf("reload: %v, want the added check's refusal", err)
	}
	if got := s.Current().Policies[0].Name; got != "orders" {
		t.Fatalf("policy in force %q, want the old orders", got)
	}
	write("policies:\n- name: other\n  match: {path: {prefix: /orders}}\n")
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := s.Current().Policies[0].Name; got != "other" {
		t.Fatalf("policy in force %q, want other", got)
	}
}

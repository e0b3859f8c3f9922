package idemclient

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/problem"
)

// documentedProblem is one row of docs/problems.md's table.
type documentedProblem struct {
	slug   string
	status int
	advice string // the "what the client should do" cell
}

var problemRow = regexp.MustCompile(`^\| <a id="([a-z0-9-]+)"></a>`)

// readDocumentedProblems reads the problem table of docs/problems.md, the
// contract the client implements.
func readDocumentedProblems(t *testing.T) []documentedProblem {
	t.Helper()
	b, err := os.ReadFile("../docs/problems.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []documentedProblem
	for line := range strings.Lines(string(b)) {
		m := problemRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), " | ")
		if len(cells) != 4 {
			t.Fatalf("docs/problems.md row %q: %d cells, want 4", m[1], len(cells))
		}
		st, err := strconv.Atoi(strings.TrimSpace(cells[1]))
		if err != nil {
			t.Fatalf("docs/problems.md row %q: status %q", m[1], cells[1])
		}
		rows = append(rows, documentedProblem{slug: m[1], status: st, advice: strings.TrimSpace(cells[3])})
	}
	if len(rows) == 0 {
		t.Fatal("no problem rows in docs/problems.md")
	}
	return rows
}

// serverProblemKinds returns every problem.Kind literal the server's
// problem package declares, slug to status, read from its source so that a
// kind added there cannot be missed here.
func serverProblemKinds(t *testing.T) map[string]int {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../internal/problem/problem.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != "Kind" {
			return true
		}
		if len(lit.Elts) != 3 {
			t.Fatalf("problem.go: a Kind literal with %d fields, want slug, title, status", len(lit.Elts))
		}
		slugLit, ok1 := lit.Elts[0].(*ast.BasicLit)
		statusLit, ok2 := lit.Elts[2].(*ast.BasicLit)
		if !ok1 || !ok2 || slugLit.Kind != token.STRING || statusLit.Kind != token.INT {
			t.Fatalf("problem.go: a Kind literal this test cannot read (slug and status must be literals)")
		}
		slug, _ := strconv.Unquote(slugLit.Value)
		st, _ := strconv.Atoi(statusLit.Value)
		kinds[slug] = st
		return false
	})
	if len(kinds) == 0 {
		t.Fatal("no Kind literals in internal/problem/problem.go")
	}
	return kinds
}

// TestEveryServerProblemIsKnown: every problem type the server can send
// (internal/problem) is documented in docs/problems.md with the same
// status, known to the client, and judged as the documentation tells a
// client: advice that begins "Retry" (the same key: request-in-progress,
// idempotency-store-unavailable, idempotency-capacity-exceeded) is retried
// with the same key after Retry-After; any other stops the chain with a
// *ProblemError of that type, never ErrUnknownProblem.
func TestEveryServerProblemIsKnown(t *testing.T) {
	docs := readDocumentedProblems(t)
	kinds := serverProblemKinds(t)
	documented := map[string]bool{}
	for _, d := range docs {
		documented[d.slug] = true
		if st, ok := kinds[d.slug]; !ok || st != d.status {
			t.Errorf("docs/problems.md has %s %d; internal/problem has it: %v, status %d", d.slug, d.status, ok, st)
		}
	}
	for slug := range kinds {
		if !documented[slug] {
			t.Errorf("internal/problem declares %q, which docs/problems.md does not document", slug)
		}
	}
	for _, d := range docs {
		t.Run(d.slug, func(t *testing.T) {
			if _, ok := knownProblems[d.slug]; !ok {
				t.Errorf("knownProblems lacks %q", d.slug)
			}
			s := newScript(t, probType(d.status, problem.TypeBase+d.slug, "Retry-After", "1"), status(201))
			tr, clock := newTestTransport(Options{})
			clock.jitter = func(time.Duration) time.Duration { return 0 }
			resp, err := tr.RoundTrip(post(t, context.Background(), s.srv.URL, "k", "b"))
			got := s.Seen()
			if strings.HasPrefix(d.advice, "Retry") {
				if err != nil {
					t.Fatalf("documented as retryable (%q), but: %v", d.advice, err)
				}
				readAll(t, resp)
				if resp.StatusCode != 201 || len(got) != 2 || got[0].Key != got[1].Key || got[1].Key != `"k"` {
					t.Fatalf("status %d after %d attempts %+v; want a second attempt with the same key", resp.StatusCode, len(got), got)
				}
				if slept := clock.Slept(); len(slept) != 1 || slept[0] < time.Second {
					t.Fatalf("slept %v; want one wait of at least Retry-After (1s)", slept)
				}
				return
			}
			var pe *ProblemError
			if !errors.As(err, &pe) || errors.Is(err, ErrUnknownProblem) || pe.Slug() != d.slug || len(got) != 1 {
				t.Fatalf("err %v after %d attempts; want a *ProblemError of %s and one attempt", err, len(got), d.slug)
			}
		})
	}
}

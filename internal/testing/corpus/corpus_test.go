package corpus

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// TestDeterministicAndInRange: a seed fixes every byte of every answer,
// bodies are valid JSON within the sizes the package promises, and two
// answers of one class differ (values vary as live ones do).
func TestDeterministicAndInRange(t *testing.T) {
	bounds := map[Class][2]int{Object: {1000, 1400}, List: {14000, 20000}, Error: {200, 400}, Mixed: {200, MaxBody},
		Order: {700, 1400}}
	for _, c := range Measured {
		a, b := New(7).Answers(c, 100), New(7).Answers(c, 100)
		other := New(8).Answer(c)
		for i := range a {
			if !same(a[i], b[i]) {
				t.Fatalf("%s %d: one seed gave two answers", c, i)
			}
			if n := len(a[i].Body); n < bounds[c][0] || n > bounds[c][1] {
				t.Errorf("%s %d: body of %d bytes, want %d to %d", c, i, n, bounds[c][0], bounds[c][1])
			}
			if !json.Valid(a[i].Body) {
				t.Fatalf("%s %d: body is not JSON: %s", c, i, a[i].Body)
			}
			if a[i].Status < 200 || a[i].Status > 599 || len(a[i].Headers) < 5 {
				t.Fatalf("%s %d: status %d, %d headers", c, i, a[i].Status, len(a[i].Headers))
			}
		}
		if same(a[0], a[1]) || same(a[0], other) {
			t.Errorf("%s: answers repeat", c)
		}
	}
}

func same(a, b idem.Response) bool {
	return a.Status == b.Status && string(a.Body) == string(b.Body) && slices.Equal(a.Headers, b.Headers)
}

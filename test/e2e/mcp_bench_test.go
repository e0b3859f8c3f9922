package e2e

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
	"github.com/idem-extproc/idem-extproc/internal/testing/harness"
)

// mcpCallBody is a tools/call of about n bytes whose arguments are many
// small objects with unsorted members (the canonicaliser's worst ordinary
// case, as internal/fingerprint's benchBody), with a progress token in
// _meta.
func mcpCallBody(n int, id int) string {
	var b strings.Builder
	b.WriteString(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"_meta":{"progressToken":"p-` + strconv.Itoa(id) +
		`"},"name":"open_ticket","arguments":{"title":"bulk import","lines":[`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"sku":"sku-` + strconv.Itoa(i) + `","qty":` + strconv.Itoa(i%7+1) + `}`)
	}
	b.WriteString(`]}}}`)
	return b.String()
}

// BenchmarkMCPRequestBodyPhase times what Envoy waits for at the request
// body of a protected tools/call, the phase message_timeout bounds: the
// 1 MiB body over gRPC, the body criteria, the key, the fingerprint of the
// call without /id and /params/_meta, and the reservation in a real
// redis-server. Each call has a new key (a first attempt). Reported as the
// median phase time (ms/phase) and the slowest (max-ms/phase). The raw
// case is the floor: the same bodies on a header-keyed policy that reads
// no JSON (bytes fingerprinted as they are), so the difference is the
// JSON path's cost.
func BenchmarkMCPRequestBodyPhase(b *testing.B) {
	const raw = `
policies:
  - name: raw
    match: {methods: [POST], path: {exact: /mcp}}
    key: {required: true}
    max_request_body: 2MiB
`
	for _, size := range []struct {
		name string
		n    int
	}{{"1KiB", 1 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1<<20 - 4<<10}} { // 1 MiB: Envoy's buffer limit, less the headroom the harness's POST needs
		for _, kind := range []string{"jsonrpc", "raw"} {
			b.Run(kind+"_"+size.name, func(b *testing.B) { benchBodyPhase(b, kind == "raw", raw, size.n) })
		}
	}
}

func benchBodyPhase(b *testing.B, isRaw bool, raw string, n int) {
	{
		{
			var mu sync.Mutex
			var phases []time.Duration
			doc := mcpPolicy(headerKey, "    max_request_body: 2MiB\n")
			if isRaw {
				doc = raw
			}
			set, err := config.Parse("bench.yaml", []byte(doc))
			if err != nil {
				b.Fatal(err)
			}
			env := harness.Start(b, harness.Options{
				Policies: set,
				// A small answer: the phase timed is the request's.
				UpstreamHandler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusOK)
					_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`))
				}),
				FilterOptions: envoysim.Options{OnReply: func(p envoysim.Phase, d time.Duration) {
					if p == envoysim.PhaseRequestBody {
						mu.Lock()
						phases = append(phases, d)
						mu.Unlock()
					}
				}},
			})
			bodies := make([]string, b.N)
			for i := range bodies {
				bodies[i] = mcpCallBody(n, i+1)
			}
			b.SetBytes(int64(len(bodies[0])))
			b.ResetTimer()
			for i := range b.N {
				r := env.Post("/mcp", fmt.Sprintf("bench-%d-%d", n, i), bodies[i])
				if r.Err != nil || r.Status != http.StatusOK {
					b.Fatalf("call %d: %d %v %.200s", i, r.Status, r.Err, r.Body)
				}
			}
			b.StopTimer()
			mu.Lock()
			defer mu.Unlock()
			if len(phases) != b.N {
				b.Fatalf("%d request body phases timed, want %d", len(phases), b.N)
			}
			slices.Sort(phases)
			b.ReportMetric(float64(phases[len(phases)/2].Microseconds())/1000, "ms/phase")
			b.ReportMetric(float64(phases[len(phases)-1].Microseconds())/1000, "max-ms/phase")
		}
	}
}

package attempt

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/jsonpointer"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// mcpCall is a tools/call body of about n bytes: the arguments carry the
// bulk, as an agent attaching a document would.
func mcpCall(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"_meta":{"progressToken":17},"name":"send_email","arguments":{"to":"a@example.com","lines":[`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"sku":"sku-` + strconv.Itoa(i) + `","qty":` + strconv.Itoa(i%7+1) + `}`)
	}
	b.WriteString(`]}}}`)
	return []byte(b.String())
}

func mustParse(b *testing.B, s string) jsonpointer.Pointer {
	p, err := jsonpointer.Parse(s)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkBodyDecision is what a tools/call decided at its body costs
// before the fingerprint: the body criteria (policy.MatchBody, one pass)
// and a derived key (one pass to find the members, one canonical pass
// over them), for the body sizes up to a policy's default limit.
func BenchmarkBodyDecision(b *testing.B) {
	pol := policy.Default()
	pol.Answers = policy.AnswersJSONRPC
	pol.Match.JSON = []policy.JSONCriterion{
		{Pointer: mustParse(b, "/method"), OneOf: []string{"tools/call"}},
		{Pointer: mustParse(b, "/params/name"), OneOf: []string{"send_email", "open_ticket"}},
	}
	pol.KeySources = []policy.KeySource{policy.KeyFromHeader, policy.KeyFromDerived}
	pol.KeyDerive = []jsonpointer.Pointer{mustParse(b, "/params/name"), mustParse(b, "/params/arguments")}
	now := time.Now()
	for _, size := range []int{1 << 10, 64 << 10, 1 << 20} {
		body := mcpCall(size)
		name := strconv.Itoa(size>>10) + "KiB"
		b.Run("match/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for range b.N {
				if _, miss := pol.MatchBody(body); miss != policy.BodyMatched {
					b.Fatal(miss)
				}
			}
		})
		b.Run("derived-key/"+name, func(b *testing.B) {
			a := New(&Server{Observer: idem.NopObserver{}}, &reporter{})
			a.Policy = pol
			b.SetBytes(int64(len(body)))
			for range b.N {
				if adm, _, _ := a.admitKeyFrom(keyInput{body: body}, now); adm != admitKeyed {
					b.Fatal(adm)
				}
			}
		})
	}
}

package policy

import "testing"

// TestSubscriptionsListenNeverProtected: a subscriptions/listen request
// passes a JSON-RPC policy whatever its criteria, even criteria that name
// the method; a call of another method still meets them.
func TestSubscriptionsListenNeverProtected(t *testing.T) {
	const listen = `{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true}}}`
	every := Default()
	every.Answers = AnswersJSONRPC
	named := Default()
	named.Answers = AnswersJSONRPC
	named.Match.JSON = []JSONCriterion{{Pointer: mustPointer("/method"), OneOf: []string{"tools/call", SubscriptionsListen}}}
	for name, p := range map[string]*Policy{"no criteria": every, "criteria naming it": named} {
		if _, miss := p.MatchBody([]byte(listen)); miss != BodySubscription {
			t.Errorf("%s: subscriptions/listen is %v, want %v", name, miss, BodySubscription)
		}
		call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}`
		if _, miss := p.MatchBody([]byte(call)); miss != BodyMatched {
			t.Errorf("%s: tools/call is %v, want %v", name, miss, BodyMatched)
		}
	}
}

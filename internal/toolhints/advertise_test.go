package toolhints

import (
	"encoding/json"
	"testing"
)

func TestAdvertise(t *testing.T) {
	body := []byte(`{"jsonrpc":"2.0","id":3,"result":{"tools":[` +
		`{"name":"send_email","inputSchema":{"type":"object"}},` +
		`{"name":"lookup","annotations":{"readOnlyHint":true}},` +
		`{"name":"charge","annotations":{"readOnlyHint":false,"idempotentHint":false,"title":"Charge"}},` +
		`{"name":"other"}],"ttlMs":60000,"cacheScope":"public"}}`)
	protected := map[string]bool{"send_email": true, "lookup": true, "charge": true}
	out, ok := Advertise(body, func(n string) bool { return protected[n] })
	if !ok {
		t.Fatal("not rewritten")
	}
	var got struct {
		ID     int `json:"id"`
		Result struct {
			Tools []struct {
				Name        string         `json:"name"`
				InputSchema map[string]any `json:"inputSchema"`
				Annotations map[string]any `json:"annotations"`
			} `json:"tools"`
			TTLMs      int    `json:"ttlMs"`
			CacheScope string `json:"cacheScope"`
		} `json:"result"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := map[string]any{"send_email": true, "lookup": nil, "charge": true, "other": nil}
	for _, tool := range got.Result.Tools {
		if tool.Annotations["idempotentHint"] != want[tool.Name] && !(want[tool.Name] == nil && tool.Annotations["idempotentHint"] == nil) {
			t.Errorf("%s: idempotentHint %v, want %v (%s)", tool.Name, tool.Annotations["idempotentHint"], want[tool.Name], out)
		}
	}
	if got.ID != 3 || got.Result.TTLMs != 60000 || got.Result.CacheScope != "private" || got.Result.Tools[2].Annotations["title"] != "Charge" ||
		got.Result.Tools[0].InputSchema["type"] != "object" {
		t.Errorf("other members changed: %s", out)
	}
	if _, ok := Advertise(body, func(string) bool { return false }); ok {
		t.Error("rewritten though no tool is protected")
	}
	if _, ok := Advertise([]byte(`{"jsonrpc":"2.0","id":3,"error":{"code":-32601}}`), func(string) bool { return true }); ok {
		t.Error("an error rewritten")
	}
}

package deploytest

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// TestREADMEEnvoyFilterIsTheFile: the filter chain README's Envoy section
// shows decodes strictly (every field known, every Any resolved and
// validated), passes the checks every shipped ext_proc filter passes, and is
// exactly envoy/envoy.yaml's, so that a reader copying it gets the tested
// configuration.
func TestREADMEEnvoyFilterIsTheFile(t *testing.T) {
	readme := string(readFile(t, filepath.Join(repoRoot, "README.md")))
	_, section, ok := strings.Cut(readme, "\n## Envoy\n")
	_, block, ok2 := strings.Cut(section, "```yaml\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README's Envoy section has no yaml block")
	}
	var doc struct {
		HTTPFilters []json.RawMessage `json:"http_filters"`
	}
	if err := yaml.UnmarshalStrict([]byte(block), &doc); err != nil {
		t.Fatalf("README's filter block: %v", err)
	}
	var names []string
	var got *extprocv3.ExternalProcessor
	for _, raw := range doc.HTTPFilters {
		var f hcmv3.HttpFilter
		if err := decodeEnvoyJSON(raw, &f); err != nil {
			t.Fatalf("README's filter block: %v", err)
		}
		names = append(names, f.GetName())
		if f.GetName() == extProcFilterName {
			ep, err := typedConfig[*extprocv3.ExternalProcessor](f.GetTypedConfig())
			if err != nil {
				t.Fatal(err)
			}
			got = ep
		}
	}
	if strings.Join(names, ",") != extProcFilterName+","+routerFilterName || got == nil {
		t.Fatalf("README's filters are %v, want ext_proc then the router", names)
	}
	if err := checkExtProc(got); err != nil {
		t.Fatalf("README's ext_proc filter: %v", err)
	}
	cfg, err := checkEnvoyConfig(readFile(t, filepath.Join(repoRoot, "envoy", "envoy.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if want := cfg.hcms[0].extProc; !proto.Equal(got, want) {
		t.Fatalf("README's ext_proc filter differs from envoy/envoy.yaml's:\n README %v\n file   %v", got, want)
	}
}

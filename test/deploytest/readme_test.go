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

// envoyDoc is the page that shows operators the filter to copy.
const envoyDoc = "docs/envoy.md"

// documentedFilterBlock is the first YAML block of envoyDoc's section "The
// filter": the filter chain a reader copies.
func documentedFilterBlock(t *testing.T) string {
	t.Helper()
	doc := string(readFile(t, filepath.Join(repoRoot, envoyDoc)))
	_, section, ok := strings.Cut(doc, "\n## The filter\n")
	_, block, ok2 := strings.Cut(section, "```yaml\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("%s has no yaml block under \"The filter\"", envoyDoc)
	}
	return block
}

// TestDocumentedEnvoyFilterIsTheFile: the filter chain docs/envoy.md shows
// decodes strictly (every field known, every Any resolved and validated),
// passes the checks every shipped ext_proc filter passes, and is exactly
// envoy/envoy.yaml's, so that a reader copying it gets the tested
// configuration.
func TestDocumentedEnvoyFilterIsTheFile(t *testing.T) {
	block := documentedFilterBlock(t)
	var doc struct {
		HTTPFilters []json.RawMessage `json:"http_filters"`
	}
	if err := yaml.UnmarshalStrict([]byte(block), &doc); err != nil {
		t.Fatalf("%s's filter block: %v", envoyDoc, err)
	}
	var names []string
	var got *extprocv3.ExternalProcessor
	for _, raw := range doc.HTTPFilters {
		var f hcmv3.HttpFilter
		if err := decodeEnvoyJSON(raw, &f); err != nil {
			t.Fatalf("%s's filter block: %v", envoyDoc, err)
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
		t.Fatalf("%s's filters are %v, want ext_proc then the router", envoyDoc, names)
	}
	if err := checkExtProc(got); err != nil {
		t.Fatalf("%s's ext_proc filter: %v", envoyDoc, err)
	}
	cfg, err := checkEnvoyConfig(readFile(t, filepath.Join(repoRoot, "envoy", "envoy.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if want := cfg.hcms[0].extProc; !proto.Equal(got, want) {
		t.Fatalf("%s's ext_proc filter differs from envoy/envoy.yaml's:\n doc  %v\n file %v", envoyDoc, got, want)
	}
}

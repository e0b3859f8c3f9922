package deploytest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"google.golang.org/protobuf/encoding/protojson"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/idem-extproc/idem-extproc/internal/testing/norace"
)

// envoy136Dir holds the module that decodes against go-control-plane's
// envoy v1.36.0: a module of its own, so the root module's ./... does not
// reach it and this test runs it.
const envoy136Dir = "envoy136"

// envoy136Doc is one configuration for the envoy136 command (its document).
type envoy136Doc struct {
	Name    string          `json:"name"`
	Type    string          `json:"type"`
	JSON    json.RawMessage `json:"json"`
	Partial bool            `json:"partial,omitempty"`
}

// Full names of the messages the documents are.
const (
	bootstrapType  = "envoy.config.bootstrap.v3.Bootstrap"
	httpFilterType = "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter"
	routeType      = "envoy.config.route.v3.Route"
	extProcType    = "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
)

// shippedEnvoyDocs gathers every Envoy configuration the repository ships,
// in the form Envoy receives it: each envoy/*.yaml as a bootstrap, each
// Istio EnvoyFilter patch value as the HttpFilter or (partial) Route it
// inserts or merges, docs/envoy.md's filter block, and the filter Envoy
// Gateway makes of each EnvoyExtensionPolicy.
func shippedEnvoyDocs(t *testing.T) []envoy136Doc {
	t.Helper()
	var docs []envoy136Doc
	for _, path := range envoyConfigFiles(t) {
		j, err := yaml.YAMLToJSONStrict(readFile(t, path))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, envoy136Doc{Name: filepath.Base(path), Type: bootstrapType, JSON: j})
	}

	var doc struct {
		HTTPFilters []json.RawMessage `json:"http_filters"`
	}
	if err := yaml.UnmarshalStrict([]byte(documentedFilterBlock(t)), &doc); err != nil || len(doc.HTTPFilters) == 0 {
		t.Fatalf("%s has no filter block: %v", envoyDoc, err)
	}
	for i, f := range doc.HTTPFilters {
		docs = append(docs, envoy136Doc{Name: fmt.Sprintf("%s http_filters[%d]", envoyDoc, i), Type: httpFilterType, JSON: f})
	}

	fsys := loadK8s(t)
	for _, dir := range append(kustomizations(t), exampleBuilds(t)...) {
		objs, err := buildObjects(fsys, dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, ef := range objectsOf[istionetv1a3.EnvoyFilter](objs) {
			for i, cp := range ef.Spec.GetConfigPatches() {
				j, err := protojson.Marshal(cp.GetPatch().GetValue())
				if err != nil {
					t.Fatal(err)
				}
				d := envoy136Doc{Name: fmt.Sprintf("%s EnvoyFilter %s configPatches[%d]", dir, ef.Name, i), JSON: j}
				switch cp.GetApplyTo() {
				case istioapi.EnvoyFilter_HTTP_FILTER:
					d.Type = httpFilterType
				case istioapi.EnvoyFilter_HTTP_ROUTE:
					d.Type, d.Partial = routeType, true
				default:
					t.Fatalf("%s: applyTo %s is not decoded here", d.Name, cp.GetApplyTo())
				}
				docs = append(docs, d)
			}
		}
		for _, p := range objectsOf[egv1a1.EnvoyExtensionPolicy](objs) {
			for i := range p.Spec.ExtProc {
				filter, err := extProcFromEnvoyGateway(&p.Spec.ExtProc[i], "envoyextensionpolicy/"+p.Namespace+"/"+p.Name)
				if err != nil {
					t.Fatal(err)
				}
				j, err := protojson.Marshal(filter)
				if err != nil {
					t.Fatal(err)
				}
				docs = append(docs, envoy136Doc{Name: dir + " EnvoyExtensionPolicy " + p.Name, Type: extProcType, JSON: j})
			}
		}
	}
	return docs
}

// runEnvoy136 runs the envoy136 command on docs and returns its verdict
// per document name ("" when the document decoded).
func runEnvoy136(t *testing.T, docs []envoy136Doc) map[string]string {
	t.Helper()
	in, err := json.Marshal(docs)
	if err != nil {
		t.Fatal(err)
	}
	// As test/codecheck does: the go command must be in PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command in PATH to run %s with: %v", envoy136Dir, err)
	}
	// -trimpath and the lock as the suite's other builds without the race
	// detector (norace.Lock), so that from empty caches the standard
	// library is compiled once for all of them, not once more here.
	cmd := exec.Command(goBin, "run", "-trimpath", ".")
	cmd.Dir = envoy136Dir
	// Its own module, whatever the caller's workspace; no go.mod rewrites.
	// After the first download it runs from the module cache.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	unlock := norace.Lock(t)
	out, err := cmd.Output()
	unlock()
	if err != nil {
		t.Fatalf("go run ./%s: %v\n%s", envoy136Dir, err, stderr.String())
	}
	verdicts := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var r struct{ Name, Error string }
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("envoy136 output: %v\n%s", err, out)
		}
		verdicts[r.Name] = r.Error
	}
	if len(verdicts) != len(docs) {
		t.Fatalf("envoy136 answered for %d of %d documents:\n%s", len(verdicts), len(docs), out)
	}
	return verdicts
}

// TestEnvoyConfigsDecodeOnEnvoy136 decodes every shipped Envoy
// configuration strictly against Envoy 1.36's API (go-control-plane envoy
// v1.36.0), the oldest Envoy docs/envoy-compatibility.md claims: a field
// that only a later Envoy knows would make 1.36 refuse the whole listener.
// Two planted documents prove the decoder has teeth: a field 1.37 added
// (allow_content_length_header) must fail, and the 1.36 fields the files
// rely on (status_on_error, max_message_timeout) must pass.
func TestEnvoyConfigsDecodeOnEnvoy136(t *testing.T) {
	docs := shippedEnvoyDocs(t)
	planted := []envoy136Doc{
		{Name: "planted 1.37 field", Type: extProcType, JSON: json.RawMessage(`{"allow_content_length_header": true}`)},
		{Name: "planted 1.36 fields", Type: extProcType, JSON: json.RawMessage(`{"status_on_error": {"code": 503}, "max_message_timeout": "2.5s"}`)},
	}
	verdicts := runEnvoy136(t, append(docs, planted...))
	for _, d := range docs {
		if e := verdicts[d.Name]; e != "" {
			t.Errorf("%s does not load on Envoy 1.36: %s", d.Name, e)
		}
	}
	if e := verdicts[planted[0].Name]; !strings.Contains(e, "allow_content_length_header") {
		t.Errorf("a field Envoy 1.36 lacks passed the 1.36 decoder: %q", e)
	}
	if e := verdicts[planted[1].Name]; e != "" {
		t.Errorf("status_on_error and max_message_timeout should exist in 1.36: %s", e)
	}
	t.Logf("%d shipped configurations decode on Envoy 1.36", len(docs))
}

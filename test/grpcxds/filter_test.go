package grpcxds_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	insecurev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/grpc_service/channel_credentials/insecure/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/idem-extproc/idem-extproc/test/grpcxds"
)

// documentedFilters are the places that tell operators which filter to
// serve to grpc-go clients, each found by the heading of its section: the
// first YAML block after it is the filter list.
var documentedFilters = []struct{ file, heading string }{
	{"../../docs/grpc.md", "## grpc-go (proxyless)"},
}

// filterSettings are the ExternalProcessor fields (by their YAML names) that
// decide whether idem-extproc can protect a grpc-go call, and what goes
// wrong when a document strays from FilterConfig on one.
var filterSettings = []struct{ field, why string }{
	{"grpc_service", "grpc-go must reach the server with credentials it may use; a timeout would bound the whole call"},
	{"processing_mode", "without request messages the fingerprint misses the payload; without the response the outcome is never recorded"},
	{"request_attributes", "grpc-go sends no pseudo-headers: policies match on these"},
	{"response_attributes", "the server asks for none"},
	{"failure_mode_allow", "true lets calls through unprotected when the server is unreachable"},
	{"allow_mode_override", "grpc-go does not implement mode_override; setting it suggests otherwise"},
	{"message_timeout", "Envoy-only: grpc-go ignores it, so documenting one promises a bound that does not exist"},
	{"max_message_timeout", "Envoy-only, as message_timeout"},
	{"observability_mode", "grpc-go would not wait for the server: nothing would be held or refused"},
	{"disable_immediate_response", "every refusal and replay would become INTERNAL"},
	{"forward_rules", "could withhold idempotency-key from the server"},
	{"mutation_rules", "could drop the headers the server sets"},
}

// TestDocumentedFilterIsFilterConfig: the ext_proc filter docs/grpc.md
// gives for grpc-go decodes strictly into the Envoy API and
// equals FilterConfig, which the proxyless tests serve, apart from the
// target address. Otherwise the tests would prove a configuration nobody
// is told to deploy.
func TestDocumentedFilterIsFilterConfig(t *testing.T) {
	for _, doc := range documentedFilters {
		t.Run(strings.TrimPrefix(doc.file, "../../"), func(t *testing.T) {
			got := documentedExtProc(t, doc.file, doc.heading)
			target := got.GetGrpcService().GetGoogleGrpc().GetTargetUri()
			if target == "" {
				t.Fatal("grpc_service.google_grpc.target_uri is not set")
			}
			want := grpcxds.FilterConfig(target)
			fields := got.ProtoReflect().Descriptor().Fields()
			checked := map[protoreflect.Name]bool{}
			for _, s := range filterSettings {
				fd := fields.ByName(protoreflect.Name(s.field))
				if fd == nil {
					t.Fatalf("ExternalProcessor has no field %s", s.field)
				}
				checked[fd.Name()] = true
				if !equalField(got, want, fd) {
					t.Errorf("%s = %s, the tests use %s: %s",
						s.field, fieldText(got, fd), fieldText(want, fd), s.why)
				}
			}
			// Whatever else a document sets must match too, or the tests
			// would not cover it.
			for i := range fields.Len() {
				fd := fields.Get(i)
				if !checked[fd.Name()] && !equalField(got, want, fd) {
					t.Errorf("%s = %s, the tests use %s", fd.Name(), fieldText(got, fd), fieldText(want, fd))
				}
			}
			// Unknown fields, say, escape the loops above.
			if !t.Failed() && !proto.Equal(got, want) {
				t.Errorf("documented filter\n%s\ndiffers from FilterConfig\n%s", protojson.Format(got), protojson.Format(want))
			}
		})
	}
}

// docTypes are the only messages a typed_config in the documented filter
// list may name, so that a mistyped type URL fails the decode.
var docTypes = func() *protoregistry.Types {
	var r protoregistry.Types
	for _, m := range []proto.Message{
		&extprocfilterv3.ExternalProcessor{},
		&routerv3.Router{},
		&insecurev3.InsecureCredentials{},
	} {
		if err := r.RegisterMessage(m.ProtoReflect().Type()); err != nil {
			panic(err)
		}
	}
	return &r
}()

// documentedExtProc decodes the filter list in the first YAML block of
// file's section under heading, the way a management server built on
// go-control-plane would read it (unknown fields and duplicate keys are
// errors), checks it is the ext_proc filter then the router, and returns
// the ext_proc configuration.
func documentedExtProc(t *testing.T, file, heading string) *extprocfilterv3.ExternalProcessor {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, err := yamlBlock(string(text), heading)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict([]byte(block))
	if err != nil {
		t.Fatalf("yaml: %v", err)
	}
	// The block is the http_filters field of an HTTP connection manager.
	var hcm hcmv3.HttpConnectionManager
	if err := (protojson.UnmarshalOptions{Resolver: docTypes}).Unmarshal(j, &hcm); err != nil {
		t.Fatalf("decode: %v", err)
	}
	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
	}
	if want := "envoy.filters.http.ext_proc envoy.filters.http.router"; strings.Join(names, " ") != want {
		t.Fatalf("filters %v, want %s: the router ends the chain, after ext_proc", names, want)
	}
	var ext *extprocfilterv3.ExternalProcessor
	for _, f := range hcm.GetHttpFilters() {
		m, err := anypb.UnmarshalNew(f.GetTypedConfig(), proto.UnmarshalOptions{Resolver: docTypes})
		if err != nil {
			t.Fatalf("%s: %v", f.GetName(), err)
		}
		if v, ok := m.(interface{ ValidateAll() error }); !ok {
			t.Fatalf("%s: %T has no validator", f.GetName(), m)
		} else if err := v.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", f.GetName(), err)
		}
		if e, ok := m.(*extprocfilterv3.ExternalProcessor); ok {
			ext = e
		}
	}
	if ext == nil {
		t.Fatalf("envoy.filters.http.ext_proc does not hold an ExternalProcessor")
	}
	return ext
}

// yamlBlock returns the first ```yaml block in text's section that starts
// at the line heading, before the next section.
func yamlBlock(text, heading string) (string, error) {
	_, section, ok := strings.Cut(text, "\n"+heading+"\n")
	if !ok {
		return "", fmt.Errorf("no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "\n```yaml\n")
	if !ok {
		return "", fmt.Errorf("section %q has no YAML block", heading)
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		return "", fmt.Errorf("section %q: YAML block not closed", heading)
	}
	return block, nil
}

func equalField(a, b proto.Message, fd protoreflect.FieldDescriptor) bool {
	ma, mb := a.ProtoReflect(), b.ProtoReflect()
	if ma.Has(fd) != mb.Has(fd) {
		return false
	}
	return ma.Get(fd).Equal(mb.Get(fd))
}

// fieldText shows one field of m: a scalar as its value, anything else as
// compact JSON or "unset".
func fieldText(m proto.Message, fd protoreflect.FieldDescriptor) string {
	r := m.ProtoReflect()
	switch {
	case fd.IsList() || fd.IsMap() || fd.Message() != nil:
		if !r.Has(fd) {
			return "unset"
		}
		only := r.Type().New()
		only.Set(fd, r.Get(fd))
		return protojson.MarshalOptions{}.Format(only.Interface())
	case fd.Enum() != nil:
		return string(fd.Enum().Values().ByNumber(r.Get(fd).Enum()).Name())
	default:
		return fmt.Sprint(r.Get(fd).Interface())
	}
}

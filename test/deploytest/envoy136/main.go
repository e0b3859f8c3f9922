// Command envoy136 decodes Envoy configurations strictly against the Envoy
// API of go-control-plane's envoy module v1.36.0, the oldest Envoy the
// shipped files claim to load on (status_on_error and max_message_timeout
// exist from there; docs/envoy-compatibility.md). The deployment tests in
// test/deploytest gather every shipped configuration (envoy/*.yaml, the
// Istio EnvoyFilter patches, docs/envoy.md's filter block, the filter Envoy
// Gateway makes of the policy), send them here on stdin as a JSON array of
// documents, and read one JSON result per document on stdout.
//
// A field or enum value that v1.36's protos lack is an unknown field here,
// exactly as Envoy 1.36 would refuse the configuration; every Any is
// resolved against the few types the files may use and validated with the
// generated ValidateAll, as in the root module's decodeEnvoyYAML.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	matchingv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	skipv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
)

// document is one configuration to decode.
type document struct {
	// Name says where it comes from, for the caller's messages.
	Name string `json:"name"`
	// Type is the message's full name: one of topTypes.
	Type string `json:"type"`
	// JSON is the configuration in the proto3 JSON mapping.
	JSON json.RawMessage `json:"json"`
	// Partial marks a fragment (an Istio MERGE patch): decoded strictly,
	// but only what its Anys hold is validated.
	Partial bool `json:"partial"`
}

// result is the answer for one document: Error is empty when it decoded.
type result struct {
	Name  string `json:"name"`
	Error string `json:"error,omitempty"`
}

// topTypes are the messages a document may be.
var topTypes = map[string]proto.Message{
	"envoy.config.bootstrap.v3.Bootstrap":                                    &bootstrapv3.Bootstrap{},
	"envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter": &hcmv3.HttpFilter{},
	"envoy.config.route.v3.Route":                                            &routev3.Route{},
	"envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor":            &extprocv3.ExternalProcessor{},
}

// anyTypes are the only messages an Any in the files may hold (the root
// module's envoyTypes, at v1.36).
var anyTypes = []proto.Message{
	&hcmv3.HttpConnectionManager{},
	&extprocv3.ExternalProcessor{},
	&extprocv3.ExtProcPerRoute{},
	&routev3.FilterConfig{},
	&routerv3.Router{},
	&jwtv3.JwtAuthentication{},
	&upstreamhttpv3.HttpProtocolOptions{},
	&streamv3.StdoutAccessLog{},
	&tlsv3.UpstreamTlsContext{},
	&tlsv3.DownstreamTlsContext{},
	&matchingv3.ExtensionWithMatcher{},
	&skipv3.SkipFilter{},
	&matcherv3.HttpRequestHeaderMatchInput{},
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "envoy136:", err)
		os.Exit(2)
	}
}

func run(in io.Reader, out io.Writer) error {
	var docs []document
	if err := json.NewDecoder(in).Decode(&docs); err != nil {
		return fmt.Errorf("reading documents: %w", err)
	}
	resolver := &protoregistry.Types{}
	for _, m := range anyTypes {
		if err := resolver.RegisterMessage(m.ProtoReflect().Type()); err != nil {
			return err
		}
	}
	enc := json.NewEncoder(out)
	for _, d := range docs {
		r := result{Name: d.Name}
		if err := decode(resolver, d); err != nil {
			r.Error = err.Error()
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// decode decodes one document strictly and validates it.
func decode(resolver *protoregistry.Types, d document) error {
	proto0, ok := topTypes[d.Type]
	if !ok {
		return fmt.Errorf("type %q is not one envoy136 decodes", d.Type)
	}
	m := proto0.ProtoReflect().New().Interface()
	opts := protojson.UnmarshalOptions{Resolver: resolver}
	if err := opts.Unmarshal(d.JSON, m); err != nil {
		return fmt.Errorf("decode %s: %w", d.Type, err)
	}
	if d.Partial {
		return validateAnys(resolver, m, string(m.ProtoReflect().Descriptor().Name()))
	}
	return validateTree(resolver, m, string(m.ProtoReflect().Descriptor().Name()))
}

type validator interface{ ValidateAll() error }

func validateTree(resolver *protoregistry.Types, m proto.Message, path string) error {
	var errs []error
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	} else {
		errs = append(errs, fmt.Errorf("%s: %T has no ValidateAll", path, m))
	}
	errs = append(errs, validateAnys(resolver, m, path))
	return errors.Join(errs...)
}

// validateAnys resolves and validates what every Any inside m holds.
func validateAnys(resolver *protoregistry.Types, m proto.Message, path string) error {
	var errs []error
	walkAnys(m.ProtoReflect(), path, func(p string, a *anypb.Any) {
		inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: resolver})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			return
		}
		errs = append(errs, validateTree(resolver, inner, p+"<"+string(inner.ProtoReflect().Descriptor().Name())+">"))
	})
	return errors.Join(errs...)
}

// walkAnys calls fn for every google.protobuf.Any set in m, at any depth
// but not inside the Anys themselves.
func walkAnys(m protoreflect.Message, path string, fn func(string, *anypb.Any)) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					visit(mv.Message(), p+"["+k.String()+"]", fn)
					return true
				})
			}
		case fd.IsList():
			if fd.Kind() == protoreflect.MessageKind {
				for i := 0; i < v.List().Len(); i++ {
					visit(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", p, i), fn)
				}
			}
		case m.Descriptor().FullName() == "envoy.config.route.v3.FilterConfig" && fd.Name() == "config" &&
			proto.Size(v.Message().Interface()) == 0:
			// Not an Any to resolve: Envoy's mark that the route turns the
			// filter on as it is (source/common/router/per_filter_config.cc).
		case fd.Kind() == protoreflect.MessageKind:
			visit(v.Message(), p, fn)
		}
		return true
	})
}

func visit(m protoreflect.Message, path string, fn func(string, *anypb.Any)) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		fn(path, a)
		return
	}
	walkAnys(m, path, fn)
}

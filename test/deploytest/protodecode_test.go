package deploytest

import (
	"errors"
	"fmt"

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
	"sigs.k8s.io/yaml"
)

// envoyTypes are the only messages a typed_config in our files may name.
// A registry of just these, rather than the global one, makes an Any of
// any other type (a typo in a type URL, an extension Envoy's default build
// may not have) fail the decode.
var envoyTypes = []proto.Message{
	&hcmv3.HttpConnectionManager{},
	&extprocv3.ExternalProcessor{},
	&extprocv3.ExtProcPerRoute{},
	// What turns a filter inserted disabled on for one route (the Istio
	// gateway's).
	&routev3.FilterConfig{},
	&routerv3.Router{},
	&jwtv3.JwtAuthentication{},
	&upstreamhttpv3.HttpProtocolOptions{},
	&streamv3.StdoutAccessLog{},
	&tlsv3.UpstreamTlsContext{},
	&tlsv3.DownstreamTlsContext{},
	// The Istio sidecar patch wraps ext_proc in a matcher that skips reads.
	&matchingv3.ExtensionWithMatcher{},
	&skipv3.SkipFilter{},
	&matcherv3.HttpRequestHeaderMatchInput{},
}

var envoyResolver = func() *protoregistry.Types {
	var r protoregistry.Types
	for _, m := range envoyTypes {
		if err := r.RegisterMessage(m.ProtoReflect().Type()); err != nil {
			panic(err) // a programming error in the list above
		}
	}
	return &r
}()

// decodeEnvoyYAML decodes YAML into an Envoy API message the way Envoy
// reads its bootstrap: YAML to JSON (duplicate keys are an error), then the
// proto3 JSON mapping with unknown fields rejected and every Any's type
// resolved. It then validates the message and everything inside its Anys.
func decodeEnvoyYAML(data []byte, into proto.Message) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	return decodeEnvoyJSON(j, into)
}

// decodeEnvoyJSON is decodeEnvoyYAML for JSON.
func decodeEnvoyJSON(j []byte, into proto.Message) error {
	opts := protojson.UnmarshalOptions{Resolver: envoyResolver, DiscardUnknown: false}
	if err := opts.Unmarshal(j, into); err != nil {
		return fmt.Errorf("decode %s: %w", into.ProtoReflect().Descriptor().FullName(), err)
	}
	return validateEnvoyTree(into, string(into.ProtoReflect().Descriptor().Name()))
}

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// validateEnvoyTree runs ValidateAll on m and, because the generated
// validators stop at an Any, resolves every Any inside m (typed_config,
// typed_per_filter_config, typed_extension_protocol_options, …) and
// validates what it holds, recursively.
func validateEnvoyTree(m proto.Message, path string) error {
	var errs []error
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	} else {
		errs = append(errs, fmt.Errorf("%s: %T has no ValidateAll", path, m))
	}
	errs = append(errs, validateAnys(m, path))
	return errors.Join(errs...)
}

// validateAnys resolves and validates what every Any inside m holds, but
// not m itself: for partial messages such as an Istio MERGE patch.
func validateAnys(m proto.Message, path string) error {
	var errs []error
	walkAnys(m.ProtoReflect(), path, func(p string, a *anypb.Any) {
		inner, err := unpackAny(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			return
		}
		if err := validateEnvoyTree(inner, p+"<"+string(inner.ProtoReflect().Descriptor().Name())+">"); err != nil {
			errs = append(errs, err)
		}
	})
	return errors.Join(errs...)
}

// unpackAny resolves an Any against envoyResolver.
func unpackAny(a *anypb.Any) (proto.Message, error) {
	return anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: envoyResolver})
}

// walkAnys calls fn for every google.protobuf.Any set in m, in singular,
// repeated and map fields, at any depth (but not inside the Anys: fn does
// that if it wants to).
func walkAnys(m protoreflect.Message, path string, fn func(path string, a *anypb.Any)) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				visitMessage(mv.Message(), p+"["+k.String()+"]", fn)
				return true
			})
		case fd.IsList():
			if fd.Kind() != protoreflect.MessageKind {
				return true
			}
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				visitMessage(l.Get(i).Message(), fmt.Sprintf("%s[%d]", p, i), fn)
			}
		case emptyFilterConfig(m, fd, v):
			// Not an Any to resolve: Envoy's mark that the route turns the
			// filter on as it is (source/common/router/per_filter_config.cc,
			// "If the field `config` is configured but is empty, we treat
			// the filter is enabled explicitly").
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			visitMessage(v.Message(), p, fn)
		}
		return true
	})
}

// emptyFilterConfig reports whether fd of m is the config of a route's
// FilterConfig, set and empty.
func emptyFilterConfig(m protoreflect.Message, fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
	if m.Descriptor().FullName() != "envoy.config.route.v3.FilterConfig" || fd.Name() != "config" {
		return false
	}
	return proto.Size(v.Message().Interface()) == 0
}

func visitMessage(m protoreflect.Message, path string, fn func(string, *anypb.Any)) {
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		a, ok := m.Interface().(*anypb.Any)
		if !ok { // a dynamic message: copy it into a concrete Any
			a = &anypb.Any{}
			b, _ := proto.Marshal(m.Interface())
			_ = proto.Unmarshal(b, a)
		}
		fn(path, a)
		return
	}
	walkAnys(m, path, fn)
}

// typedConfig unpacks a typed_config Any into a message of type T.
func typedConfig[T proto.Message](a *anypb.Any) (T, error) {
	var zero T
	m, err := unpackAny(a)
	if err != nil {
		return zero, err
	}
	t, ok := m.(T)
	if !ok {
		return zero, fmt.Errorf("typed_config is %s, want %T", m.ProtoReflect().Descriptor().FullName(), zero)
	}
	return t, nil
}

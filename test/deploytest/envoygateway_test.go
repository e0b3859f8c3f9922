package deploytest

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"

	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// egAttributeRE is the pattern Envoy Gateway's CRD puts on attributes
// (api/v1alpha1/ext_proc_types.go); the Go type does not enforce it.
var egAttributeRE = regexp.MustCompile(`^(connection\.|source\.|destination\.|request\.|response\.|upstream\.|xds\.route_)[a-z_1-9]*$`)

// egServiceTimeout is the grpc_service timeout Envoy Gateway sets on every
// ext_proc filter it makes (internal/xds/translator/utils.go
// defaultExtServiceRequestTimeout, extproc.go extProcConfig). Envoy does
// not apply it to the ext_proc stream (see checkRoutes), so the route
// timeouts need not fit under it.
const egServiceTimeout = 10 * time.Second

// egDefaultBufferLimit is the per-connection buffer Envoy Gateway gives a
// listener without a ClientTrafficPolicy connection.bufferLimit
// (internal/xds/translator/listener.go,
// tcpListenerPerConnectionBufferLimitBytes, buildPerConnectionBufferLimitBytes).
const egDefaultBufferLimit = 32768

// extProcFromEnvoyGateway builds the ext_proc filter configuration Envoy
// Gateway makes of an ExtProc, following its translator as of v1.9
// (internal/gatewayapi/envoyextensionpolicy.go, which turns the policy into
// its IR, and internal/xds/translator/extproc.go, which turns that into the
// filter): a present request or response section means that direction's
// headers are sent, its body mode is the one named (none when unnamed),
// trailers are skipped unless a body is FullDuplexStreamed, attributes are
// copied per direction. The result is validated as any Envoy config is.
func extProcFromEnvoyGateway(ep *egv1a1.ExtProc, cluster string) (*extprocv3.ExternalProcessor, error) {
	pm := &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_SKIP,
		ResponseHeaderMode:  extprocv3.ProcessingMode_SKIP,
		RequestBodyMode:     extprocv3.ProcessingMode_NONE,
		ResponseBodyMode:    extprocv3.ProcessingMode_NONE,
		RequestTrailerMode:  extprocv3.ProcessingMode_SKIP,
		ResponseTrailerMode: extprocv3.ProcessingMode_SKIP,
	}
	c := &extprocv3.ExternalProcessor{
		GrpcService: &corev3.GrpcService{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster}},
			Timeout:         durationpb.New(egServiceTimeout),
		},
		ProcessingMode: pm,
	}
	var errs []error
	body := func(m *egv1a1.ExtProcBodyProcessingMode) (extprocv3.ProcessingMode_BodySendMode, bool) {
		if m == nil {
			return extprocv3.ProcessingMode_NONE, false
		}
		switch *m {
		case egv1a1.BufferedExtProcBodyProcessingMode:
			return extprocv3.ProcessingMode_BUFFERED, false
		case egv1a1.BufferedPartialExtBodyHeaderProcessingMode:
			return extprocv3.ProcessingMode_BUFFERED_PARTIAL, false
		case egv1a1.StreamedExtProcBodyProcessingMode:
			return extprocv3.ProcessingMode_STREAMED, false
		case egv1a1.FullDuplexStreamedExtBodyProcessingMode:
			return extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED, true
		}
		errs = append(errs, fmt.Errorf("body %q is not one of the CRD's modes", *m))
		return extprocv3.ProcessingMode_NONE, false
	}
	if mode := ep.ProcessingMode; mode != nil {
		if r := mode.Request; r != nil {
			pm.RequestHeaderMode = extprocv3.ProcessingMode_SEND
			var trailers bool
			if pm.RequestBodyMode, trailers = body(r.Body); trailers {
				pm.RequestTrailerMode = extprocv3.ProcessingMode_SEND
			}
			c.RequestAttributes = r.Attributes
		}
		if r := mode.Response; r != nil {
			pm.ResponseHeaderMode = extprocv3.ProcessingMode_SEND
			var trailers bool
			if pm.ResponseBodyMode, trailers = body(r.Body); trailers {
				pm.ResponseTrailerMode = extprocv3.ProcessingMode_SEND
			}
			c.ResponseAttributes = r.Attributes
		}
		c.AllowModeOverride = mode.AllowModeOverride
	}
	for _, a := range append(slices.Clone(c.RequestAttributes), c.ResponseAttributes...) {
		if !egAttributeRE.MatchString(a) {
			errs = append(errs, fmt.Errorf("attribute %q does not match the CRD's pattern", a))
		}
	}
	if ep.FailOpen != nil {
		c.FailureModeAllow = *ep.FailOpen
	}
	if ep.ShadowMode != nil {
		c.ObservabilityMode = *ep.ShadowMode
	}
	if ep.MessageTimeout != nil {
		d, err := time.ParseDuration(string(*ep.MessageTimeout))
		if err != nil {
			errs = append(errs, fmt.Errorf("messageTimeout: %w", err))
		}
		c.MessageTimeout = durationpb.New(d)
	}
	if md := ep.Metadata; md != nil {
		c.MetadataOptions = &extprocv3.MetadataOptions{}
		if md.AccessibleNamespaces != nil {
			c.MetadataOptions.ForwardingNamespaces = &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: md.AccessibleNamespaces}
		}
		if md.WritableNamespaces != nil {
			c.MetadataOptions.ReceivingNamespaces = &extprocv3.MetadataOptions_MetadataNamespaces{Untyped: md.WritableNamespaces}
		}
	}
	if ep.StatusOnError != nil {
		c.StatusOnError = &typev3.HttpStatus{Code: typev3.StatusCode(*ep.StatusOnError)}
	}
	if err := validateEnvoyTree(c, "ExternalProcessor"); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// checkEnvoyGatewayObjects checks the EnvoyExtensionPolicies of a build:
// the filter they make passes checkExtProc; the backend is the server's
// gRPC Service, reachable through a ReferenceGrant, with health checks,
// circuit breakers and a connect timeout; the routes they target have the
// timeout rule, and every route they leave out is read-only.
func checkEnvoyGatewayObjects(objs []k8sObject) error {
	policies := objectsOf[egv1a1.EnvoyExtensionPolicy](objs)
	if len(policies) == 0 {
		return nil
	}
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	needs, err := serverPolicyNeeds(objs)
	if err != nil {
		return err
	}
	// Envoy Gateway cannot set max_message_timeout (no such field in
	// api/v1alpha1/ext_proc_types.go, none written by
	// internal/xds/translator/extproc.go extProcConfig, v1.9 to main), so
	// the server's override_message_timeout is always ignored.
	if needs.maxWait > 0 {
		fail("%s has a policy with wait_for_in_flight %v, which Envoy Gateway cannot serve: it cannot set max_message_timeout, so Envoy ignores the server's override_message_timeout and ends every wait in its own error reply",
			needs.where, needs.maxWait)
	}
	egNeeds := needs
	egNeeds.maxWait = 0 // reported above
	if err := checkEGFilterOrder(objs); err != nil {
		errs = append(errs, err)
	}
	targeted := map[string]*extprocv3.ExternalProcessor{} // namespace/name of HTTPRoute -> filter
	for _, p := range policies {
		where := "EnvoyExtensionPolicy " + p.Namespace + "/" + p.Name
		if len(p.Spec.ExtProc) != 1 {
			fail("%s: want one extProc, got %d", where, len(p.Spec.ExtProc))
			continue
		}
		ep := &p.Spec.ExtProc[0]
		filter, err := extProcFromEnvoyGateway(ep, "envoyextensionpolicy/"+p.Namespace+"/"+p.Name+"/extproc/0")
		if err != nil {
			fail("%s: %v", where, err)
		}
		if err := checkExtProc(filter); err != nil {
			fail("%s: ext_proc filter: %v", where, err)
		}
		if err := checkFilterServes(filter, egNeeds, srv.cfg.StoreTimeout); err != nil {
			fail("%s: ext_proc filter: %v", where, err)
		}
		if mt := messageTimeout(filter); srv.cfg.StoreTimeout+messageTimeoutMargin > mt {
			fail("%s: the server's --store-timeout %v leaves less than %v under messageTimeout %v",
				where, srv.cfg.StoreTimeout, messageTimeoutMargin, mt)
		}
		if err := checkEGBackend(objs, p, ep); err != nil {
			fail("%s: %v", where, err)
		}
		//lint:ignore SA1019 the deprecated field must stay unset: it is what is checked.
		if p.Spec.TargetRef != nil || len(p.Spec.TargetSelectors) > 0 || len(p.Spec.TargetRefs) == 0 {
			fail("%s: name the routes in targetRefs (targetRef and targetSelectors are not checked here)", where)
		}
		for _, ref := range p.Spec.TargetRefs {
			if ref.Group != gwv1.GroupName || ref.Kind != "HTTPRoute" {
				fail("%s: targets %s %s; these tests check HTTPRoute targets", where, ref.Kind, ref.Name)
				continue
			}
			if objectNamed[gwv1.HTTPRoute](objs, p.Namespace, string(ref.Name)) == nil {
				fail("%s: targets HTTPRoute %s, which is not in the build", where, ref.Name)
			}
			targeted[p.Namespace+"/"+string(ref.Name)] = filter
		}
	}
	for _, r := range objectsOf[gwv1.HTTPRoute](objs) {
		filter := targeted[r.Namespace+"/"+r.Name]
		if filter != nil {
			for _, pr := range r.Spec.ParentRefs {
				if err := checkEGBufferLimit(objs, r, pr, needs); err != nil {
					errs = append(errs, err)
				}
			}
		}
		for i, rule := range r.Spec.Rules {
			where := fmt.Sprintf("HTTPRoute %s/%s rule %d", r.Namespace, r.Name, i)
			if filter == nil {
				for _, m := range gatewayRuleMethods(rule) {
					if !slices.Contains(readOnlyMethods, m) {
						fail("%s matches %s, which may write, and no EnvoyExtensionPolicy protects it", where, m)
					}
				}
				continue
			}
			// Envoy Gateway turns the rule's retry into the route's
			// retry_policy (internal/gatewayapi/route.go
			// processRouteRetry, internal/xds/translator/route.go
			// buildRetryPolicy, v1.9).
			if rule.Retry != nil {
				fail("%s: retry would re-send writes past the ext_proc filter (Envoy Gateway writes it as the route's retry_policy); remove it", where)
			}
			// A RequestHeaderModifier's remove becomes the route's
			// request_headers_to_remove (internal/gatewayapi/filters.go,
			// internal/xds/translator/route.go buildXdsRoute, v1.9).
			var removed []string
			for _, f := range rule.Filters {
				if f.Type == gwv1.HTTPRouteFilterRequestHeaderModifier && f.RequestHeaderModifier != nil {
					removed = append(removed, f.RequestHeaderModifier.Remove...)
				}
			}
			for _, h := range retryHeadersKept(removed) {
				fail("%s: a client's %s would arm router retries that re-send writes past the ext_proc filter; remove it with a RequestHeaderModifier filter", where, h)
			}
			if rule.Timeouts == nil || rule.Timeouts.Request == nil {
				fail("%s: set timeouts.request (the route-timeout rule)", where)
				continue
			}
			d, err := time.ParseDuration(string(*rule.Timeouts.Request))
			if err != nil || d <= 0 {
				fail("%s: timeouts.request %q must be a finite duration", where, *rule.Timeouts.Request)
			} else if life := maxProtectedLifetime(d, filter); life >= recommendedClientTimeout {
				fail("%s: timeout plus four message_timeouts and max_message_timeout is %v, not under the %v client timeout (docs/envoy.md, a protected request's time in Envoy)", where, life, recommendedClientTimeout)
			}
		}
	}
	if err := checkEGRetryPolicies(objs, targeted); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkEGRetryPolicies refuses a BackendTrafficPolicy retry that reaches a
// protected route (protected: namespace/name of HTTPRoute -> its filter).
// spec.retry (ClusterSettings.Retry, inline in BackendTrafficPolicySpec:
// api/v1alpha1/shared_types.go and backendtrafficpolicy_types.go, v1.9)
// becomes the retry of every route the policy reaches
// (internal/gatewayapi/backendtrafficpolicy.go buildTrafficFeatures,
// ir.HTTPRoute.GetRetry) and so the route's retry_policy; a policy on a
// Gateway reaches the routes attached to it. Unset, Envoy Gateway
// configures no retries ("If not set, retry will be disabled"); set
// without numRetries, it retries twice (retry_types.go). Any retry is
// refused, whatever numRetries says: with a retry_policy in place, a
// trusted x-envoy-max-retries header takes precedence over its count
// (Envoy's router filter docs, x-envoy-max-retries).
func checkEGRetryPolicies(objs []k8sObject, protected map[string]*extprocv3.ExternalProcessor) error {
	var errs []error
	for _, p := range objectsOf[egv1a1.BackendTrafficPolicy](objs) {
		if p.Spec.Retry == nil {
			continue
		}
		where := "BackendTrafficPolicy " + p.Namespace + "/" + p.Name
		if len(p.Spec.TargetSelectors) > 0 {
			errs = append(errs, fmt.Errorf("%s: retry with targetSelectors: these tests cannot tell whether it reaches a protected route; name the targets in targetRefs", where))
			continue
		}
		refs := slices.Clone(p.Spec.TargetRefs)
		//lint:ignore SA1019 the deprecated field still attaches the policy.
		if ref := p.Spec.TargetRef; ref != nil {
			refs = append(refs, *ref)
		}
		for _, ref := range refs {
			for _, r := range objectsOf[gwv1.HTTPRoute](objs) {
				if protected[r.Namespace+"/"+r.Name] == nil || !egPolicyReaches(p.Namespace, ref, r) {
					continue
				}
				errs = append(errs, fmt.Errorf("%s: retry reaches protected HTTPRoute %s/%s through %s %s and would re-send writes past the ext_proc filter; remove it",
					where, r.Namespace, r.Name, ref.Kind, ref.Name))
			}
		}
	}
	return errors.Join(errs...)
}

// egPolicyReaches reports whether a policy in namespace ns with target ref
// applies to route r: the route itself, or a Gateway (any of its
// listeners) the route attaches to. Policy targets are local to the
// policy's namespace (gwv1.LocalPolicyTargetReferenceWithSectionName).
func egPolicyReaches(ns string, ref gwv1.LocalPolicyTargetReferenceWithSectionName, r *gwv1.HTTPRoute) bool {
	if ref.Group != gwv1.GroupName {
		return false
	}
	switch ref.Kind {
	case "HTTPRoute":
		return r.Namespace == ns && r.Name == string(ref.Name)
	case "Gateway":
		return slices.ContainsFunc(r.Spec.ParentRefs, func(pr gwv1.ParentReference) bool {
			prNS := r.Namespace
			if pr.Namespace != nil {
				prNS = string(*pr.Namespace)
			}
			isGateway := pr.Kind == nil || *pr.Kind == "Gateway"
			return isGateway && prNS == ns && pr.Name == ref.Name
		})
	}
	return false
}

// checkEGBackend checks where and how an ExtProc calls the server.
func checkEGBackend(objs []k8sObject, p *egv1a1.EnvoyExtensionPolicy, ep *egv1a1.ExtProc) error {
	//lint:ignore SA1019 the deprecated field must stay unset: it is what is checked.
	if ep.BackendRef != nil || len(ep.BackendRefs) != 1 {
		return errors.New("want exactly one entry in backendRefs")
	}
	ref := ep.BackendRefs[0].BackendObjectReference
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Service") || ref.Port == nil {
		return errors.New("backendRefs[0] must be a core Service with a port")
	}
	ns := p.Namespace
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	var errs []error
	svc := objectNamed[corev1.Service](objs, ns, string(ref.Name))
	if svc == nil {
		errs = append(errs, fmt.Errorf("backend Service %s/%s is not in the build", ns, ref.Name))
	} else if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool {
		return sp.Port == int32(*ref.Port) && sp.AppProtocol != nil && *sp.AppProtocol == "grpc"
	}) {
		errs = append(errs, fmt.Errorf("Service %s has no port %d with appProtocol grpc", svc.Name, *ref.Port))
	}
	if ns != p.Namespace && !referenceGranted(objs, p.Namespace, ns, string(ref.Name)) {
		errs = append(errs, fmt.Errorf("no ReferenceGrant in %s lets EnvoyExtensionPolicies of %s use Service %s", ns, p.Namespace, ref.Name))
	}
	bs := ep.BackendSettings
	if bs == nil {
		return errors.Join(append(errs, errors.New("set backendSettings: health check, circuit breaker, connect timeout"))...)
	}
	if bs.HealthCheck == nil || bs.HealthCheck.Active == nil || bs.HealthCheck.Active.Type != egv1a1.ActiveHealthCheckerTypeGRPC {
		errs = append(errs, errors.New("backendSettings.healthCheck.active must be of type GRPC (the server serves grpc.health.v1)"))
	}
	if bs.CircuitBreaker == nil || bs.CircuitBreaker.MaxParallelRequests == nil {
		errs = append(errs, errors.New("backendSettings.circuitBreaker.maxParallelRequests: one ext_proc stream is one request, size it explicitly"))
	}
	if bs.Timeout == nil || bs.Timeout.TCP == nil || bs.Timeout.TCP.ConnectTimeout == nil {
		errs = append(errs, errors.New("backendSettings.timeout.tcp.connectTimeout: set it, at most 1s"))
	} else if d, err := time.ParseDuration(string(*bs.Timeout.TCP.ConnectTimeout)); err != nil || d > time.Second {
		errs = append(errs, fmt.Errorf("connectTimeout %s: at most 1s, so a dead server fails fast", *bs.Timeout.TCP.ConnectTimeout))
	}
	return errors.Join(errs...)
}

// referenceGranted reports whether a ReferenceGrant in toNS lets
// EnvoyExtensionPolicies in fromNS refer to the Service name.
func referenceGranted(objs []k8sObject, fromNS, toNS, name string) bool {
	for _, g := range objectsOf[gwv1beta1.ReferenceGrant](objs) {
		if g.Namespace != toNS {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gwv1beta1.ReferenceGrantFrom) bool {
			return f.Group == egv1a1.GroupName && f.Kind == egv1a1.KindEnvoyExtensionPolicy && string(f.Namespace) == fromNS
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gwv1beta1.ReferenceGrantTo) bool {
			return t.Group == "" && t.Kind == "Service" && (t.Name == nil || string(*t.Name) == name)
		})
		if from && to {
			return true
		}
	}
	return false
}

// gatewayRuleMethods lists the methods an HTTPRoute rule matches.
func gatewayRuleMethods(rule gwv1.HTTPRouteRule) []string {
	if len(rule.Matches) == 0 {
		return httpMethods
	}
	var out []string
	for _, m := range rule.Matches {
		if m.Method == nil {
			return httpMethods
		}
		if !slices.Contains(out, string(*m.Method)) {
			out = append(out, string(*m.Method))
		}
	}
	return out
}

// checkEGBufferLimit: the Gateway a protected route attaches to must buffer
// the policies' bodies. Envoy Gateway's listeners hold egDefaultBufferLimit
// per connection unless a ClientTrafficPolicy targeting the Gateway sets
// connection.bufferLimit (api/v1alpha1/connection_types.go
// ClientConnection.BufferLimit); the BUFFERED ext_proc filter needs the
// whole body within it, or a request gets 413 and a response 500.
func checkEGBufferLimit(objs []k8sObject, r *gwv1.HTTPRoute, pr gwv1.ParentReference, needs filterNeeds) error {
	ns := r.Namespace
	if pr.Namespace != nil {
		ns = string(*pr.Namespace)
	}
	where := fmt.Sprintf("HTTPRoute %s/%s (Gateway %s/%s)", r.Namespace, r.Name, ns, pr.Name)
	limit := int64(egDefaultBufferLimit)
	from := "Envoy Gateway's default"
	for _, ctp := range objectsOf[egv1a1.ClientTrafficPolicy](objs) {
		if ctp.Namespace != ns {
			continue // a ClientTrafficPolicy targets Gateways of its own namespace
		}
		//lint:ignore SA1019 the deprecated field must stay unset: it is what is checked.
		if ctp.Spec.TargetRef != nil || len(ctp.Spec.TargetSelectors) > 0 {
			return fmt.Errorf("%s: ClientTrafficPolicy %s: name the Gateway in targetRefs (targetRef and targetSelectors are not checked here)", where, ctp.Name)
		}
		for _, ref := range ctp.Spec.TargetRefs {
			if ref.Kind != "Gateway" || ref.Name != pr.Name || (ref.SectionName != nil && (pr.SectionName == nil || *ref.SectionName != *pr.SectionName)) {
				continue
			}
			if c := ctp.Spec.Connection; c != nil && c.BufferLimit != nil {
				limit, from = c.BufferLimit.Value(), "ClientTrafficPolicy "+ctp.Name
			}
		}
	}
	if body := max(needs.maxBody, policy.DefaultMaxBody); limit < int64(body) {
		return fmt.Errorf("%s: the per-connection buffer is %d bytes (%s), below the %d-byte bodies of %s: "+
			"a larger protected request gets 413 and a larger response 500; set connection.bufferLimit in a ClientTrafficPolicy targeting the Gateway",
			where, limit, from, body, needs.where)
	}
	return nil
}

// egFilterOrder is Envoy Gateway's default order of the HTTP filters that
// matter here (internal/xds/translator/httpfilters.go newOrderedHTTPFilter,
// v1.9): lower first in the decoder chain. One filter of each type stands
// for all of its instances.
var egFilterOrder = []struct {
	filter egv1a1.EnvoyFilter
	order  int
}{
	{egv1a1.EnvoyFilterCustomResponse, 0},
	{egv1a1.EnvoyFilterHealthCheck, 1},
	{egv1a1.EnvoyFilterFault, 2},
	{egv1a1.EnvoyFilterCORS, 3},
	{egv1a1.EnvoyFilterCSRF, 4},
	{egv1a1.EnvoyFilterHeaderMutation, 5},
	{egv1a1.EnvoyFilterExtAuthz, 6},
	{egv1a1.EnvoyFilterAPIKeyAuth, 7},
	{egv1a1.EnvoyFilterBasicAuth, 8},
	{egv1a1.EnvoyFilterOAuth2, 9},
	{egv1a1.EnvoyFilterJWTAuthn, 10},
	{egv1a1.EnvoyFilterSessionPersistence, 11},
	{egv1a1.EnvoyFilterBuffer, 12},
	{egv1a1.EnvoyFilterLua, 13},
	{egv1a1.EnvoyFilterExtProc, 100},
	{egv1a1.EnvoyFilterWasm, 200},
	{egv1a1.EnvoyFilterDynamicModules, 250},
	{egv1a1.EnvoyFilterGeoIP, 300},
	{egv1a1.EnvoyFilterRBAC, 301},
	{egv1a1.EnvoyFilterLocalRateLimit, 302},
	{egv1a1.EnvoyFilterRateLimit, 303},
	{egv1a1.EnvoyFilterBandwidthLimit, 304},
	{egv1a1.EnvoyFilterGRPCWeb, 305},
	{egv1a1.EnvoyFilterGRPCStats, 306},
	{egv1a1.EnvoyFilterCredentialInjector, 307},
	{egv1a1.EnvoyFilterCompressor, 308},
	{egv1a1.EnvoyFilterDynamicForwardProxy, 309},
	{egv1a1.EnvoyFilterRouter, 310},
}

// egSortFilters applies an EnvoyProxy's filterOrder to Envoy Gateway's
// default order as sortHTTPFilters does: each entry in turn moves the
// named filter right before the first filter of its Before type, or right
// after the last one of its After type; an entry whose filters are absent
// does nothing.
func egSortFilters(order []egv1a1.FilterPosition) []egv1a1.EnvoyFilter {
	chain := make([]egv1a1.EnvoyFilter, len(egFilterOrder))
	for i, f := range egFilterOrder {
		chain[i] = f.filter
	}
	for _, pos := range order {
		i := slices.Index(chain, pos.Name)
		if i < 0 || pos.Name == egv1a1.EnvoyFilterRouter {
			continue
		}
		var anchor egv1a1.EnvoyFilter
		if pos.Before != nil {
			anchor = *pos.Before
		} else if pos.After != nil {
			anchor = *pos.After
		}
		if anchor == pos.Name || !slices.Contains(chain, anchor) {
			continue
		}
		chain = slices.Delete(chain, i, i+1)
		j := slices.Index(chain, anchor)
		if pos.After != nil {
			j++
		}
		chain = slices.Insert(chain, j, pos.Name)
	}
	return chain
}

// checkEGFilterOrder: an EnvoyProxy in the build must move ext_proc after
// RBAC and both rate limits. In Envoy Gateway's default order it runs
// before them, so a request they refuse already holds a reservation and
// their local reply (403, 429) passes the filter's response phase as an
// Envoy-made answer; after them, a refused request never reaches it.
func checkEGFilterOrder(objs []k8sObject) error {
	proxies := objectsOf[egv1a1.EnvoyProxy](objs)
	if len(proxies) == 0 {
		return errors.New("no EnvoyProxy in the build: Envoy Gateway runs ext_proc before RBAC and the rate limits (httpfilters.go); ship one whose filterOrder moves it after them")
	}
	var errs []error
	for _, p := range proxies {
		chain := egSortFilters(p.Spec.FilterOrder)
		ep := slices.Index(chain, egv1a1.EnvoyFilterExtProc)
		for _, f := range []egv1a1.EnvoyFilter{egv1a1.EnvoyFilterRBAC, egv1a1.EnvoyFilterLocalRateLimit, egv1a1.EnvoyFilterRateLimit} {
			if slices.Index(chain, f) > ep {
				errs = append(errs, fmt.Errorf("EnvoyProxy %s/%s: %s runs after %s; add filterOrder {name: %s, after: %s}",
					p.Namespace, p.Name, f, egv1a1.EnvoyFilterExtProc, egv1a1.EnvoyFilterExtProc, f))
			}
		}
	}
	return errors.Join(errs...)
}

// TestEGSortFiltersFollowsEnvoyGateway pins the model of Envoy Gateway's
// sortHTTPFilters that checkEGFilterOrder relies on: by default ext_proc
// runs before RBAC and the rate limits; "after" puts it right after its
// anchor, "before" right before it; an absent anchor moves nothing; the
// router stays last.
func TestEGSortFiltersFollowsEnvoyGateway(t *testing.T) {
	ptr := func(f egv1a1.EnvoyFilter) *egv1a1.EnvoyFilter { return &f }
	at := func(chain []egv1a1.EnvoyFilter, f egv1a1.EnvoyFilter) int { return slices.Index(chain, f) }
	def := egSortFilters(nil)
	if at(def, egv1a1.EnvoyFilterExtProc) > at(def, egv1a1.EnvoyFilterRBAC) {
		t.Fatalf("default order %v: ext_proc should run before rbac", def)
	}
	after := egSortFilters([]egv1a1.FilterPosition{{Name: egv1a1.EnvoyFilterExtProc, After: ptr(egv1a1.EnvoyFilterRBAC)}})
	if at(after, egv1a1.EnvoyFilterExtProc) != at(after, egv1a1.EnvoyFilterRBAC)+1 {
		t.Errorf("after rbac: %v", after)
	}
	before := egSortFilters([]egv1a1.FilterPosition{{Name: egv1a1.EnvoyFilterRBAC, Before: ptr(egv1a1.EnvoyFilterExtProc)}})
	if at(before, egv1a1.EnvoyFilterRBAC) != at(before, egv1a1.EnvoyFilterExtProc)-1 {
		t.Errorf("rbac before ext_proc: %v", before)
	}
	absent := egSortFilters([]egv1a1.FilterPosition{{Name: egv1a1.EnvoyFilterExtProc, After: ptr("envoy.filters.http.not_there")}})
	if !slices.Equal(absent, def) {
		t.Errorf("an absent anchor moved filters: %v", absent)
	}
	router := egSortFilters([]egv1a1.FilterPosition{{Name: egv1a1.EnvoyFilterRouter, Before: ptr(egv1a1.EnvoyFilterFault)}})
	if router[len(router)-1] != egv1a1.EnvoyFilterRouter {
		t.Errorf("the router moved: %v", router)
	}
}

// TestEGRetryRefusedOnProtectedRoutesOnly: a BackendTrafficPolicy retry is
// refused when it reaches the protected route (directly, through its
// Gateway, through the deprecated targetRef, or through selectors that
// cannot be evaluated here) and left alone on the read-only route; an
// HTTPRoute rule's retry likewise.
func TestEGRetryRefusedOnProtectedRoutesOnly(t *testing.T) {
	base, err := buildObjects(loadK8s(t), exampleBuild("orders-envoy-gateway"))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkEnvoyGatewayObjects(base); err != nil {
		t.Fatalf("the overlay and its example: %v", err)
	}
	ref := func(kind, name string) gwv1.LocalPolicyTargetReferenceWithSectionName {
		return gwv1.LocalPolicyTargetReferenceWithSectionName{LocalPolicyTargetReference: gwv1.LocalPolicyTargetReference{
			Group: gwv1.GroupName, Kind: gwv1.Kind(kind), Name: gwv1.ObjectName(name),
		}}
	}
	policy := func(ns string, retry *egv1a1.Retry, targets egv1a1.PolicyTargetReferences) k8sObject {
		p := &egv1a1.BackendTrafficPolicy{}
		p.Namespace, p.Name = ns, "retries"
		p.Spec.PolicyTargetReferences = targets
		p.Spec.Retry = retry
		return k8sObject{apiVersion: egv1a1.GroupVersion.String(), kind: egv1a1.KindBackendTrafficPolicy, namespace: ns, name: p.Name, obj: p}
	}
	twice := &egv1a1.Retry{NumRetries: new(int32(2))}
	never := &egv1a1.Retry{NumRetries: new(int32(0))}
	withRouteRetry := func(route string) []k8sObject {
		var out []k8sObject
		for _, o := range base {
			if r, ok := o.obj.(*gwv1.HTTPRoute); ok && r.Name == route {
				r = r.DeepCopy()
				r.Spec.Rules[0].Retry = &gwv1.HTTPRouteRetry{Attempts: new(2)}
				o.obj = r
			}
			out = append(out, o)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		objs   []k8sObject
		refuse string // "" when the build must pass
	}{
		{"policy on the write route", append(slices.Clone(base), policy("orders", twice, egv1a1.PolicyTargetReferences{TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{ref("HTTPRoute", "orders-write")}})),
			"retry reaches protected HTTPRoute orders/orders-write"},
		{"policy with numRetries 0 on the write route", append(slices.Clone(base), policy("orders", never, egv1a1.PolicyTargetReferences{TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{ref("HTTPRoute", "orders-write")}})),
			"retry reaches protected HTTPRoute orders/orders-write"},
		{"policy on the Gateway", append(slices.Clone(base), policy("envoy-gateway-system", twice, egv1a1.PolicyTargetReferences{TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{ref("Gateway", "eg")}})),
			"through Gateway eg"},
		//lint:ignore SA1019 the deprecated field still attaches a policy: it is what is checked.
		{"policy on the Gateway, deprecated targetRef", append(slices.Clone(base), policy("envoy-gateway-system", twice, egv1a1.PolicyTargetReferences{TargetRef: new(ref("Gateway", "eg"))})),
			"through Gateway eg"},
		{"policy by selector", append(slices.Clone(base), policy("orders", twice, egv1a1.PolicyTargetReferences{TargetSelectors: []egv1a1.TargetSelector{{Kind: "HTTPRoute"}}})),
			"targetSelectors"},
		{"policy on a Gateway of that name in another namespace", append(slices.Clone(base), policy("orders", twice, egv1a1.PolicyTargetReferences{TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{ref("Gateway", "eg")}})),
			""},
		{"policy on the read route", append(slices.Clone(base), policy("orders", twice, egv1a1.PolicyTargetReferences{TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{ref("HTTPRoute", "orders-read")}})),
			""},
		{"policy without retry on the Gateway", append(slices.Clone(base), policy("envoy-gateway-system", nil, egv1a1.PolicyTargetReferences{TargetRefs: []gwv1.LocalPolicyTargetReferenceWithSectionName{ref("Gateway", "eg")}})),
			""},
		{"retry on the write route's rule", withRouteRetry("orders-write"), "orders-write rule 0: retry"},
		{"retry on the read route's rule", withRouteRetry("orders-read"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkEnvoyGatewayObjects(tc.objs)
			switch {
			case tc.refuse == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Fatalf("got %v, want a refusal naming %q", err, tc.refuse)
			}
		})
	}
}

package deploytest

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const hcmFilterName = "envoy.filters.network.http_connection_manager"

// istioClusterRE parses Istio's name for a Service's cluster.
var istioClusterRE = regexp.MustCompile(`^outbound\|(\d+)\|\|([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local$`)

// checkIstioObjects checks the EnvoyFilters of a build: each ext_proc
// patch is decoded strictly into the Envoy API and passes checkExtProc; it
// is inserted before the router; its cluster is the server's gRPC Service,
// with a DestinationRule bounding it; the gateway's filter is inserted
// disabled and enabled by name on protected routes only, which have the
// timeout rule and no retries; the sidecar's is bounded to a port and
// skips reads.
func checkIstioObjects(objs []k8sObject) error {
	efs := objectsOf[istionetv1a3.EnvoyFilter](objs)
	if len(efs) == 0 {
		return nil
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	needs, err := serverPolicyNeeds(objs)
	if err != nil {
		return err
	}
	if err := checkServerSidecarDrain(objs, srv); err != nil {
		errs = append(errs, err)
	}
	gw, err := istioGatewayFilter(objs)
	if err != nil {
		errs = append(errs, err)
	}
	if gw.inserted && !gw.disabled {
		fail("the ingress gateway's ext_proc filter runs on every route through the gateway, other applications' too: insert it disabled (HttpFilter.disabled) and enable it on the protected routes by name")
	}
	var filters []*extprocv3.ExternalProcessor
	sidecar := false
	for _, ef := range efs {
		where := "EnvoyFilter " + ef.Namespace + "/" + ef.Name
		if ef.Spec.GetWorkloadSelector() == nil && ef.Namespace != "istio-system" {
			fail("%s: no workloadSelector outside the root namespace", where)
		}
		for i, cp := range ef.Spec.GetConfigPatches() {
			where := fmt.Sprintf("%s configPatches[%d]", where, i)
			if cp.GetApplyTo() != istioapi.EnvoyFilter_HTTP_FILTER {
				continue // HTTP_ROUTE: istioGatewayFilter; others: refused there
			}
			value, err := protojson.Marshal(cp.GetPatch().GetValue())
			if err != nil {
				fail("%s: %v", where, err)
				continue
			}
			ep, skipped, _, err := checkIstioFilterPatch(cp, value)
			if err != nil {
				fail("%s: %v", where, err)
			}
			if ep == nil {
				continue
			}
			filters = append(filters, ep)
			for _, m := range skipped {
				if !slices.Contains(readOnlyMethods, m) {
					fail("%s: the matcher skips the filter for %s, which may write", where, m)
				}
			}
			// Istio's inbound listener has one catch-all route
			// (pilot route.BuildDefaultHTTPInboundRoute): no route
			// to disable the filter on, so reads must be skipped
			// by the filter's own matcher, or every GET opens a
			// stream and fails closed while the server is down.
			if cp.GetMatch().GetContext() == istioapi.EnvoyFilter_SIDECAR_INBOUND {
				sidecar = true
				for _, m := range readOnlyMethods {
					if !slices.Contains(skipped, m) {
						fail("%s: the sidecar filter runs for %s: wrap it in an ExtensionWithMatcher that skips read-only methods (the inbound route is a catch-all)", where, m)
					}
				}
				// Without a port, every inbound HTTP port of the
				// workload passes the filter (istio/api
				// envoy_filter.proto, ListenerMatch.port_number: "If
				// not specified, matches all listeners").
				if cp.GetMatch().GetListener().GetPortNumber() == 0 {
					fail("%s: the sidecar filter matches every inbound port of the workload: set listener.portNumber to the protected Service's port", where)
				}
			}
			if err := checkFilterServes(ep, needs, srv.cfg.StoreTimeout); err != nil {
				fail("%s: %v", where, err)
			}
			if err := checkIstioExtProcCluster(objs, extProcCluster(ep)); err != nil {
				fail("%s: %v", where, err)
			}
			if mt := messageTimeout(ep); srv.cfg.StoreTimeout+messageTimeoutMargin > mt {
				fail("%s: the server's --store-timeout %v leaves less than %v under message_timeout %v",
					where, srv.cfg.StoreTimeout, messageTimeoutMargin, mt)
			}
		}
	}
	if len(filters) == 0 {
		fail("no EnvoyFilter inserts the ext_proc filter")
		return errors.Join(errs...)
	}
	if err := checkVirtualServices(objs, gw, filters[0]); err != nil {
		errs = append(errs, err)
	}
	// The sidecar's inbound route has no timeout (Istio's
	// BuildDefaultHTTPInboundRoute sets 0), so the route-timeout rule must
	// be kept on the callers' side: a VirtualService bound to the mesh,
	// whose routes checkVirtualServices has checked above.
	if sidecar && !slices.ContainsFunc(objectsOf[istionetv1.VirtualService](objs), func(vs *istionetv1.VirtualService) bool {
		return slices.Contains(vs.Spec.GetGateways(), "mesh") && len(vs.Spec.GetHttp()) > 0
	}) {
		fail("a sidecar filter is configured but no VirtualService bound to the mesh (gateways: [mesh]) sets the callers' timeout and retries: the inbound route has none")
	}
	return errors.Join(errs...)
}

// istioGateway is what a build's EnvoyFilters do to the ingress gateway's
// routes: whether they insert the ext_proc filter there, disabled or not,
// and the route patches that turn it on or off by name.
type istioGateway struct {
	inserted, disabled bool
	routes             []istioRoutePatch
}

// istioRoutePatch is one HTTP_ROUTE patch: the virtual host ("" for any)
// and route it names, and whether it turns the filter on or off there.
type istioRoutePatch struct {
	vhost, route string
	enable       bool
	where        string
}

// istioGatewayFilter reads the GATEWAY patches of a build's EnvoyFilters.
// A route patch must be a MERGE of a typed_per_filter_config entry for the
// filter into a route matched by name: Envoy's FilterConfig with an empty
// config (on: per_filter_config.cc, "If the field `config` is configured
// but is empty, we treat the filter is enabled explicitly"), or with
// disabled: true, or ExtProcPerRoute{disabled: true} (off).
func istioGatewayFilter(objs []k8sObject) (istioGateway, error) {
	var gw istioGateway
	var errs []error
	for _, ef := range objectsOf[istionetv1a3.EnvoyFilter](objs) {
		for i, cp := range ef.Spec.GetConfigPatches() {
			where := fmt.Sprintf("EnvoyFilter %s/%s configPatches[%d]", ef.Namespace, ef.Name, i)
			value, err := protojson.Marshal(cp.GetPatch().GetValue())
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", where, err))
				continue
			}
			switch cp.GetApplyTo() {
			case istioapi.EnvoyFilter_HTTP_FILTER:
				hf := &hcmv3.HttpFilter{}
				if err := decodeEnvoyJSON(value, hf); err != nil {
					continue // reported by checkIstioFilterPatch
				}
				if cp.GetMatch().GetContext() == istioapi.EnvoyFilter_GATEWAY && hf.GetName() == extProcFilterName {
					gw.inserted, gw.disabled = true, hf.GetDisabled()
				}
			case istioapi.EnvoyFilter_HTTP_ROUTE:
				// A MERGE patch is a partial Route: decode strictly, but
				// validate only what its Anys hold.
				r := &routev3.Route{}
				if err := (protojson.UnmarshalOptions{Resolver: envoyResolver}).Unmarshal(value, r); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", where, err))
					continue
				}
				if err := validateAnys(r, "Route"); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", where, err))
				}
				enable, err := istioRouteExtProc(r.GetTypedPerFilterConfig())
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", where, err))
					continue
				}
				vh := cp.GetMatch().GetRouteConfiguration().GetVhost()
				if vh.GetRoute().GetName() == "" || cp.GetPatch().GetOperation() != istioapi.EnvoyFilter_Patch_MERGE ||
					cp.GetMatch().GetContext() != istioapi.EnvoyFilter_GATEWAY {
					errs = append(errs, fmt.Errorf("%s: want a MERGE into a GATEWAY route matched by name", where))
					continue
				}
				gw.routes = append(gw.routes, istioRoutePatch{vhost: vh.GetName(), route: vh.GetRoute().GetName(), enable: enable, where: where})
			case istioapi.EnvoyFilter_ROUTE_CONFIGURATION:
				// A MERGE into the gateway's route configuration of a port
				// (internal_only_headers, regions_test.go): decoded strictly.
				rc := &routev3.RouteConfiguration{}
				if err := (protojson.UnmarshalOptions{Resolver: envoyResolver}).Unmarshal(value, rc); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", where, err))
					continue
				}
				if cp.GetPatch().GetOperation() != istioapi.EnvoyFilter_Patch_MERGE || cp.GetMatch().GetRouteConfiguration().GetPortNumber() == 0 {
					errs = append(errs, fmt.Errorf("%s: want a MERGE into the route configuration of one port", where))
				}
			default:
				errs = append(errs, fmt.Errorf("%s: applyTo %s is not checked by these tests", where, cp.GetApplyTo()))
			}
		}
	}
	return gw, errors.Join(errs...)
}

// istioRouteExtProc reads a route patch's typed_per_filter_config entry for
// the ext_proc filter: true when it turns the filter on, false when off.
func istioRouteExtProc(per map[string]*anypb.Any) (bool, error) {
	a, ok := per[extProcFilterName]
	if !ok || len(per) != 1 {
		return false, fmt.Errorf("want one typed_per_filter_config entry, for %s", extProcFilterName)
	}
	m, err := unpackAny(a)
	if err != nil {
		return false, err
	}
	switch c := m.(type) {
	case *routev3.FilterConfig:
		if c.GetDisabled() {
			return false, nil
		}
		if c.GetConfig().GetTypeUrl() != "" || c.GetConfig() == nil {
			return false, errors.New("FilterConfig: want an empty config (the filter as inserted, turned on) or disabled: true")
		}
		return true, nil
	case *extprocv3.ExtProcPerRoute:
		if !c.GetDisabled() {
			return false, errors.New("ExtProcPerRoute.overrides is not checked by these tests; turn the filter on with FilterConfig{config: {}}")
		}
		return false, nil
	}
	return false, fmt.Errorf("%s is not a per-route config these tests read", m.ProtoReflect().Descriptor().FullName())
}

// istioGatewayRoute is one route of a VirtualService bound to a Gateway,
// and whether the gateway's ext_proc filter runs on it.
type istioGatewayRoute struct {
	route   *istioapi.HTTPRoute
	reaches bool
	patches []istioRoutePatch // the route patches that match it
	where   string
}

// istioGatewayRoutes lists the routes of the build's VirtualServices bound
// to a Gateway, with whether the gateway's filter runs on each: a filter
// inserted disabled runs where a matching patch turns it on, one inserted
// enabled everywhere but where one turns it off. A patch matches when its
// route name is one Istio gives the route and its virtual host ("" for
// any) is one Istio makes for the VirtualService on that Gateway
// (istioVirtualHosts).
func istioGatewayRoutes(objs []k8sObject, gw istioGateway) ([]istioGatewayRoute, error) {
	var out []istioGatewayRoute
	var errs []error
	for _, vs := range objectsOf[istionetv1.VirtualService](objs) {
		vhosts, err := istioVirtualHosts(objs, vs)
		if err != nil {
			errs = append(errs, err)
		}
		if len(vhosts) == 0 {
			continue // bound to the mesh only
		}
		for _, r := range vs.Spec.GetHttp() {
			gr := istioGatewayRoute{route: r, reaches: gw.inserted && !gw.disabled,
				where: "VirtualService " + vs.Namespace + "/" + vs.Name + " route " + r.GetName()}
			names := istioRouteNames(r)
			for _, p := range gw.routes {
				if slices.Contains(names, p.route) && (p.vhost == "" || slices.Contains(vhosts, p.vhost)) {
					gr.patches = append(gr.patches, p)
					if gw.inserted {
						gr.reaches = p.enable
					}
				}
			}
			out = append(out, gr)
		}
	}
	return out, errors.Join(errs...)
}

// istioRouteNames are the names Istio gives the Envoy routes of one
// VirtualService route: its name, or <name>.<match name> for a match that
// has one (istio/istio pilot/pkg/networking/core/route/route.go,
// translateRoute).
func istioRouteNames(r *istioapi.HTTPRoute) []string {
	names := []string{r.GetName()}
	for _, m := range r.GetMatch() {
		if m.GetName() != "" {
			names = append(names, r.GetName()+"."+m.GetName())
		}
	}
	return names
}

// istioVirtualHosts are the names of the gateway virtual hosts Istio puts
// a VirtualService's routes in: host:port for each of its hosts and each
// server port of the Gateways it is bound to (istio/istio pilot/pkg/
// networking/core/gateway.go, buildGatewayHTTPRouteConfig,
// util.DomainName(hostname, server.Port.Number)). Server hosts are not
// intersected with the VirtualService's here: the example's are the same.
func istioVirtualHosts(objs []k8sObject, vs *istionetv1.VirtualService) ([]string, error) {
	var out []string
	var errs []error
	for _, ref := range vs.Spec.GetGateways() {
		if ref == "mesh" {
			continue
		}
		ns, name, ok := strings.Cut(ref, "/")
		if !ok {
			ns, name = vs.Namespace, ref
		}
		g := objectNamed[istionetv1.Gateway](objs, ns, name)
		if g == nil {
			errs = append(errs, fmt.Errorf("VirtualService %s/%s: Gateway %s/%s is not in the build", vs.Namespace, vs.Name, ns, name))
			continue
		}
		for _, srv := range g.Spec.GetServers() {
			for _, h := range vs.Spec.GetHosts() {
				out = append(out, net.JoinHostPort(h, strconv.Itoa(int(srv.GetPort().GetNumber()))))
			}
		}
	}
	return out, errors.Join(errs...)
}

// checkVirtualServices applies the route rules to Istio's routes: a
// gateway route the filter runs on, and every route of a VirtualService
// bound to the mesh (the callers' side of the sidecar variant), has the
// timeout rule and no retries; a gateway route it does not run on matches
// only reads; every route patch matches a route.
func checkVirtualServices(objs []k8sObject, gw istioGateway, ep *extprocv3.ExternalProcessor) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	routes, err := istioGatewayRoutes(objs, gw)
	if err != nil {
		errs = append(errs, err)
	}
	protected := map[*istioapi.HTTPRoute]bool{}
	matched := map[string]bool{}
	for _, gr := range routes {
		for _, p := range gr.patches {
			matched[p.where] = true
		}
		if gr.reaches {
			protected[gr.route] = true
			continue
		}
		methods, err := istioRouteMethods(gr.route)
		if err != nil {
			fail("%s: %v", gr.where, err)
			continue
		}
		for _, m := range methods {
			if !slices.Contains(readOnlyMethods, m) {
				fail("%s matches %s, which may write, and the gateway's ext_proc filter does not run on it: enable it there by name", gr.where, m)
			}
		}
	}
	for _, p := range gw.routes {
		if !matched[p.where] {
			fail("%s names route %s (virtual host %q), which no VirtualService bound to a Gateway in the build has: the route it was meant for is unprotected", p.where, p.route, p.vhost)
		}
	}
	for _, vs := range objectsOf[istionetv1.VirtualService](objs) {
		mesh := slices.Contains(vs.Spec.GetGateways(), "mesh")
		for _, r := range vs.Spec.GetHttp() {
			if !mesh && !protected[r] {
				continue
			}
			where := "VirtualService " + vs.Namespace + "/" + vs.Name + " route " + r.GetName()
			if r.GetTimeout() == nil || r.GetTimeout().AsDuration() <= 0 {
				fail("%s: set an explicit route timeout (the route-timeout rule)", where)
			} else if life := maxProtectedLifetime(r.GetTimeout().AsDuration(), ep); life >= recommendedClientTimeout {
				fail("%s: timeout plus four message_timeouts and max_message_timeout is %v, not under the %v client timeout (docs/envoy.md, a protected request's time in Envoy)", where, life, recommendedClientTimeout)
			}
			// Without retries Istio retries anyway: HTTPRoute.retries
			// defaults to 2 attempts on connect-failure, refused-stream,
			// unavailable and cancelled, or to the mesh's
			// defaultHttpRetryPolicy (istio/api networking/v1alpha3/
			// virtual_service.proto, HTTPRoute.retries; mesh/v1alpha1/
			// config.proto default_http_retry_policy). Only attempts: 0
			// turns retries off (HTTPRetry.attempts: "If `0`, retries will
			// be disabled"; istio/istio pilot/pkg/networking/core/route/
			// retry/retry.go ConvertPolicy returns no policy for it).
			// headers.request.remove becomes the route's
			// request_headers_to_remove (istio/istio pilot/pkg/networking/
			// core/route/route.go TranslateHeadersOperations).
			for _, h := range retryHeadersKept(r.GetHeaders().GetRequest().GetRemove()) {
				fail("%s: a client's %s would arm router retries that re-send writes past ext_proc; add it to headers.request.remove", where, h)
			}
			switch rt := r.GetRetries(); {
			case rt == nil:
				fail("%s: no retries: Istio then retries twice (or as the mesh's defaultHttpRetryPolicy says) and re-sends writes past ext_proc; set retries.attempts: 0", where)
			case rt.GetAttempts() != 0:
				fail("%s: retries.attempts %d re-sends writes past ext_proc; set retries.attempts: 0", where, rt.GetAttempts())
			}
		}
	}
	return errors.Join(errs...)
}

// checkServerSidecarDrain: when the server's pods get a sidecar, that
// sidecar must outlive the server's shutdown. On SIGTERM istio-agent drains
// Envoy for terminationDrainDuration and then kills it (istio/api
// mesh/v1alpha1 ProxyConfig.termination_drain_duration, "If not set, a
// default of 5s"), while the server sleeps through preStop and then drains
// open streams for --drain-timeout: a stream still open after the sidecar
// is gone is cut, and its record turns unknown.
func checkServerSidecarDrain(objs []k8sObject, srv *serverDeployment) error {
	ns := objectNamed[corev1.Namespace](objs, "", serverNamespace)
	pod := srv.dep.Spec.Template
	injected := ns != nil && ns.Labels["istio-injection"] == "enabled"
	if v, ok := pod.Labels["sidecar.istio.io/inject"]; ok {
		injected = v == "true"
	}
	if !injected {
		return nil
	}
	c := serverContainer(srv.dep)
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	want := preStop + srv.cfg.DrainTimeout
	drain := 5 * time.Second
	if raw, ok := pod.Annotations[istioProxyConfigAnnotation]; ok {
		j, err := yaml.YAMLToJSONStrict([]byte(raw))
		if err != nil {
			return fmt.Errorf("annotation %s: %w", istioProxyConfigAnnotation, err)
		}
		pc := &meshv1alpha1.ProxyConfig{}
		if err := (protojson.UnmarshalOptions{}).Unmarshal(j, pc); err != nil {
			return fmt.Errorf("annotation %s: %w", istioProxyConfigAnnotation, err)
		}
		if d := pc.GetTerminationDrainDuration(); d != nil {
			drain = d.AsDuration()
		}
	}
	if drain < want {
		return fmt.Errorf("the server's sidecar drains for %v (%s terminationDrainDuration) but the server may still answer streams for preStop %v + --drain-timeout %v = %v",
			drain, istioProxyConfigAnnotation, preStop, srv.cfg.DrainTimeout, want)
	}
	if tgp := srv.dep.Spec.Template.Spec.TerminationGracePeriodSeconds; tgp != nil && time.Duration(*tgp)*time.Second < drain {
		return fmt.Errorf("terminationGracePeriodSeconds %d is shorter than the sidecar's drain %v", *tgp, drain)
	}
	return nil
}

// istioProxyConfigAnnotation overrides the mesh's ProxyConfig for a pod
// (istio/api annotation, proxy.istio.io/config).
const istioProxyConfigAnnotation = "proxy.istio.io/config"

// checkIstioFilterPatch checks one HTTP_FILTER patch and returns the
// ext_proc filter it inserts (nil for another filter), the methods for
// which a wrapping matcher skips it, and whether it is inserted disabled.
func checkIstioFilterPatch(cp *istioapi.EnvoyFilter_EnvoyConfigObjectPatch, value []byte) (*extprocv3.ExternalProcessor, []string, bool, error) {
	hf := &hcmv3.HttpFilter{}
	if err := decodeEnvoyJSON(value, hf); err != nil {
		return nil, nil, false, err
	}
	if hf.GetName() != extProcFilterName {
		return nil, nil, false, fmt.Errorf("inserts %s, which these tests do not check", hf.GetName())
	}
	var errs []error
	tc, skipped, err := unwrapMatcher(hf.GetTypedConfig())
	if err != nil {
		return nil, nil, false, err
	}
	ep, err := typedConfig[*extprocv3.ExternalProcessor](tc)
	if err != nil {
		return nil, nil, false, err
	}
	if err := checkExtProc(ep); err != nil {
		errs = append(errs, fmt.Errorf("ext_proc filter: %w", err))
	}
	m := cp.GetMatch()
	if c := m.GetContext(); c != istioapi.EnvoyFilter_GATEWAY && c != istioapi.EnvoyFilter_SIDECAR_INBOUND {
		errs = append(errs, fmt.Errorf("context %s: want GATEWAY or SIDECAR_INBOUND, where requests enter", c))
	}
	f := m.GetListener().GetFilterChain().GetFilter()
	if cp.GetPatch().GetOperation() != istioapi.EnvoyFilter_Patch_INSERT_BEFORE ||
		f.GetName() != hcmFilterName || f.GetSubFilter().GetName() != routerFilterName {
		errs = append(errs, fmt.Errorf("want INSERT_BEFORE %s in %s", routerFilterName, hcmFilterName))
	}
	return ep, skipped, hf.GetDisabled(), errors.Join(errs...)
}

// checkIstioExtProcCluster: the cluster is Istio's for the server's
// Service on a port with appProtocol grpc (so Istio speaks HTTP/2), and a
// DestinationRule sets its connect timeout and circuit breakers.
func checkIstioExtProcCluster(objs []k8sObject, cluster string) error {
	m := istioClusterRE.FindStringSubmatch(cluster)
	if m == nil {
		return fmt.Errorf("cluster %q is not Istio's outbound|<port>||<service>.<namespace>.svc.cluster.local", cluster)
	}
	port, _ := strconv.Atoi(m[1])
	svc := objectNamed[corev1.Service](objs, m[3], m[2])
	if svc == nil {
		return fmt.Errorf("cluster %s: no Service %s/%s in the build", cluster, m[3], m[2])
	}
	grpc := slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool {
		return int(p.Port) == port && p.AppProtocol != nil && *p.AppProtocol == "grpc"
	})
	if !grpc {
		return fmt.Errorf("cluster %s: Service %s has no port %d with appProtocol grpc: Istio would not use HTTP/2", cluster, svc.Name, port)
	}
	host := m[2] + "." + m[3] + ".svc.cluster.local"
	for _, dr := range objectsOf[istionetv1.DestinationRule](objs) {
		if dr.Spec.GetHost() != host {
			continue
		}
		cp := dr.Spec.GetTrafficPolicy().GetConnectionPool()
		if cp.GetHttp().GetHttp2MaxRequests() <= 0 || cp.GetTcp().GetConnectTimeout() == nil ||
			cp.GetTcp().GetConnectTimeout().AsDuration() > time.Second {
			return fmt.Errorf("DestinationRule %s: set connectionPool http.http2MaxRequests and tcp.connectTimeout (at most 1s)", dr.Name)
		}
		return nil
	}
	return fmt.Errorf("no DestinationRule for %s: the ext_proc cluster would have Istio's default limits", host)
}

// istioRouteMethods lists the methods an Istio HTTP route matches.
func istioRouteMethods(r *istioapi.HTTPRoute) ([]string, error) {
	if len(r.GetMatch()) == 0 {
		return httpMethods, nil
	}
	var out []string
	for _, m := range r.GetMatch() {
		sm := m.GetMethod()
		for _, method := range httpMethods {
			var ok bool
			switch {
			case sm == nil:
				ok = true
			case sm.GetExact() != "":
				ok = method == sm.GetExact()
			case sm.GetPrefix() != "":
				ok = strings.HasPrefix(method, sm.GetPrefix())
			case sm.GetRegex() != "":
				re, err := regexp.Compile("^(?:" + sm.GetRegex() + ")$") // Istio's regex matches the whole value
				if err != nil {
					return nil, err
				}
				ok = re.MatchString(method)
			default:
				return nil, fmt.Errorf("method match %v is not evaluated by these tests", sm)
			}
			if ok && !slices.Contains(out, method) {
				out = append(out, method)
			}
		}
	}
	return out, nil
}

// anotherApplication is a second application behind the same ingress
// gateway, which knows nothing of idem-extproc: its own Gateway and a
// write route with no timeout or retry settings of ours.
const anotherApplication = `apiVersion: networking.istio.io/v1
kind: Gateway
metadata:
  name: shop-gateway
  namespace: shop
spec:
  selector:
    istio: ingressgateway
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: [shop.example.com]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: shop
  namespace: shop
spec:
  hosts: [shop.example.com]
  gateways: [shop-gateway]
  http:
  - name: checkout
    route:
    - destination:
        host: shop.shop.svc.cluster.local
`

// TestIstioGatewayFilterRunsOnProtectedRoutesOnly: with the overlay and
// the orders example applied (and, the same, the chart with its Istio
// values), of every route through the ingress gateway, another
// application's included, the ext_proc filter runs on the orders write
// route only.
func TestIstioGatewayFilterRunsOnProtectedRoutesOnly(t *testing.T) {
	other, err := decodeManifests(anotherApplication)
	if err != nil {
		t.Fatal(err)
	}
	kustomized, err := buildObjects(loadK8s(t), exampleBuild("orders-istio"))
	if err != nil {
		t.Fatal(err)
	}
	charted, err := renderChart(t, filepath.Join(repoRoot, chartDir, "ci", "istio-values.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	charted = append(charted, applicationObjects(t, "k8s/examples/orders-istio/gateway.yaml", "k8s/examples/orders-istio/virtualservice.yaml")...)
	for name, objs := range map[string][]k8sObject{"kustomize": kustomized, "helm": charted} {
		t.Run(name, func(t *testing.T) {
			objs = append(slices.Clone(objs), other...)
			gw, err := istioGatewayFilter(objs)
			if err != nil {
				t.Fatal(err)
			}
			routes, err := istioGatewayRoutes(objs, gw)
			if err != nil {
				t.Fatal(err)
			}
			var reached []string
			for _, gr := range routes {
				if gr.reaches {
					reached = append(reached, gr.where)
				}
			}
			want := []string{"VirtualService orders/orders route orders-write"}
			if !slices.Equal(reached, want) {
				t.Fatalf("the gateway's ext_proc filter runs on %q, want %q", reached, want)
			}
			if len(routes) != 3 {
				t.Fatalf("%d gateway routes, want orders-read, orders-write and checkout", len(routes))
			}
		})
	}
}

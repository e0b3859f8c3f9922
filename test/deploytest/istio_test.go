package deploytest

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
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
// with a DestinationRule bounding it; the routes it exempts are read-only,
// and every other route has the timeout rule and no retries.
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
	exempt := map[string]bool{}
	var filters []*extprocv3.ExternalProcessor
	sidecar := false
	for _, ef := range efs {
		where := "EnvoyFilter " + ef.Namespace + "/" + ef.Name
		if ef.Spec.GetWorkloadSelector() == nil && ef.Namespace != "istio-system" {
			fail("%s: no workloadSelector outside the root namespace", where)
		}
		for i, cp := range ef.Spec.GetConfigPatches() {
			where := fmt.Sprintf("%s configPatches[%d]", where, i)
			value, err := protojson.Marshal(cp.GetPatch().GetValue())
			if err != nil {
				fail("%s: %v", where, err)
				continue
			}
			switch cp.GetApplyTo() {
			case istioapi.EnvoyFilter_HTTP_FILTER:
				ep, skipped, err := checkIstioFilterPatch(cp, value)
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
			case istioapi.EnvoyFilter_HTTP_ROUTE:
				// A MERGE patch is a partial Route: decode strictly, but
				// validate only what its Anys hold.
				r := &routev3.Route{}
				if err := (protojson.UnmarshalOptions{Resolver: envoyResolver}).Unmarshal(value, r); err != nil {
					fail("%s: %v", where, err)
					continue
				}
				if err := validateAnys(r, "Route"); err != nil {
					fail("%s: %v", where, err)
				}
				disabled, err := extProcDisabled(r.GetTypedPerFilterConfig())
				if err != nil {
					fail("%s: %v", where, err)
				}
				name := cp.GetMatch().GetRouteConfiguration().GetVhost().GetRoute().GetName()
				if !disabled || name == "" || cp.GetPatch().GetOperation() != istioapi.EnvoyFilter_Patch_MERGE {
					fail("%s: want a MERGE of ExtProcPerRoute{disabled: true} into a route matched by name", where)
					continue
				}
				exempt[name] = true
			case istioapi.EnvoyFilter_ROUTE_CONFIGURATION:
				// A MERGE into the gateway's route configuration of a port
				// (internal_only_headers, regions_test.go): decoded strictly.
				rc := &routev3.RouteConfiguration{}
				if err := (protojson.UnmarshalOptions{Resolver: envoyResolver}).Unmarshal(value, rc); err != nil {
					fail("%s: %v", where, err)
					continue
				}
				if cp.GetPatch().GetOperation() != istioapi.EnvoyFilter_Patch_MERGE || cp.GetMatch().GetRouteConfiguration().GetPortNumber() == 0 {
					fail("%s: want a MERGE into the route configuration of one port", where)
				}
			default:
				fail("%s: applyTo %s is not checked by these tests", where, cp.GetApplyTo())
			}
		}
	}
	if len(filters) == 0 {
		fail("no EnvoyFilter inserts the ext_proc filter")
		return errors.Join(errs...)
	}
	if err := checkVirtualServices(objs, exempt, filters[0]); err != nil {
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
// ext_proc filter it inserts (nil for another filter) and the methods for
// which a wrapping matcher skips it.
func checkIstioFilterPatch(cp *istioapi.EnvoyFilter_EnvoyConfigObjectPatch, value []byte) (*extprocv3.ExternalProcessor, []string, error) {
	hf := &hcmv3.HttpFilter{}
	if err := decodeEnvoyJSON(value, hf); err != nil {
		return nil, nil, err
	}
	if hf.GetName() != extProcFilterName {
		return nil, nil, fmt.Errorf("inserts %s, which these tests do not check", hf.GetName())
	}
	var errs []error
	tc, skipped, err := unwrapMatcher(hf.GetTypedConfig())
	if err != nil {
		return nil, nil, err
	}
	ep, err := typedConfig[*extprocv3.ExternalProcessor](tc)
	if err != nil {
		return nil, nil, err
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
	return ep, skipped, errors.Join(errs...)
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

// checkVirtualServices applies the route rules to Istio's routes.
func checkVirtualServices(objs []k8sObject, exempt map[string]bool, ep *extprocv3.ExternalProcessor) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	seen := map[string]bool{}
	for _, vs := range objectsOf[istionetv1.VirtualService](objs) {
		for _, r := range vs.Spec.GetHttp() {
			where := "VirtualService " + vs.Namespace + "/" + vs.Name + " route " + r.GetName()
			seen[r.GetName()] = true
			methods, err := istioRouteMethods(r)
			if err != nil {
				fail("%s: %v", where, err)
				continue
			}
			if exempt[r.GetName()] {
				for _, m := range methods {
					if !slices.Contains(readOnlyMethods, m) {
						fail("%s is exempt from ext_proc but matches %s, which may write", where, m)
					}
				}
				continue
			}
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
	for name := range exempt {
		if !seen[name] {
			fail("an EnvoyFilter exempts route %s, which no VirtualService defines", name)
		}
	}
	return errors.Join(errs...)
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

package deploytest

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/encoding/protojson"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/idem-extproc/idem-extproc/internal/extproc"
)

// homeFront is what checkHomeRoutes reads of one connection manager.
type homeFront struct {
	listener string
	rc       *routev3.RouteConfiguration
	extProc  *extprocv3.ExternalProcessor
	// homeRoutes are the routes matching extproc.HomeHeader, by name.
	homeRoutes map[string]*routev3.Route
	mtls       bool
}

// TestHomeRoutes: an Envoy configuration that sends requests home
// (docs/regions.md, "Sending requests home") keeps the promises the
// server's loop guard relies on, and fails with the file's listener named
// otherwise:
//
//   - a connection manager with a route matching the home header lists the
//     header in internal_only_headers, so that no client chooses that route
//     or forges the mark (conn_manager_utility.cc cleanInternalHeaders runs
//     before the filters and the route selection);
//   - its ext_proc filter lets the server's reply clear the route cache
//     (route_cache_action DEFAULT or CLEAR, and no
//     disable_clear_route_cache: processor_state.cc
//     DecodingProcessorState::clearRouteCache);
//   - the connection manager that keeps the header (the one other regions
//     send to) has no route matching it, so a request sent home is never
//     sent on by Envoy either, and requires a client certificate, so only
//     another region's Envoy can send it the mark;
//   - a home route waits longer than the receiving front's protected routes
//     with their ext_proc phases, so that the sending Envoy, not a client,
//     sees how the attempt ended.
func TestHomeRoutes(t *testing.T) {
	found := false
	for _, path := range envoyConfigFiles(t) {
		cfg, err := checkEnvoyConfig(readFile(t, path))
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(path), err)
		}
		fronts := homeFronts(cfg)
		if !slices.ContainsFunc(fronts, func(f homeFront) bool { return len(f.homeRoutes) > 0 }) {
			continue
		}
		found = true
		if err := checkHomeRoutes(fronts); err != nil {
			t.Errorf("%s: %v", filepath.Base(path), err)
		}
	}
	if !found {
		t.Fatal("no shipped Envoy configuration sends requests home (envoy/envoy-regions.yaml)")
	}
}

// homeFronts reads every connection manager with the ext_proc filter.
func homeFronts(cfg *envoyConfig) []homeFront {
	var out []homeFront
	for _, l := range cfg.bootstrap.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm, err := typedConfig[*hcmv3.HttpConnectionManager](f.GetTypedConfig())
				if err != nil {
					continue
				}
				front := homeFront{listener: l.GetName(), rc: hcm.GetRouteConfig(), homeRoutes: map[string]*routev3.Route{}, mtls: requiresClientCert(fc)}
				for _, hf := range hcm.GetHttpFilters() {
					if hf.GetName() == extProcFilterName {
						front.extProc, _ = typedConfig[*extprocv3.ExternalProcessor](hf.GetTypedConfig())
					}
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.GetRoutes() {
						for _, h := range r.GetMatch().GetHeaders() {
							if strings.EqualFold(h.GetName(), extproc.HomeHeader) {
								front.homeRoutes[r.GetName()] = r
							}
						}
					}
				}
				out = append(out, front)
			}
		}
	}
	return out
}

// requiresClientCert reports whether a filter chain's TLS requires the
// client's certificate.
func requiresClientCert(fc *listenerv3.FilterChain) bool {
	ts := fc.GetTransportSocket()
	if ts == nil {
		return false
	}
	d, err := typedConfig[*tlsv3.DownstreamTlsContext](ts.GetTypedConfig())
	return err == nil && d.GetRequireClientCertificate().GetValue()
}

// refusesMarked reports whether a route matches only requests without the
// home header.
func refusesMarked(r *routev3.Route) bool {
	return slices.ContainsFunc(r.GetMatch().GetHeaders(), func(h *routev3.HeaderMatcher) bool {
		return strings.EqualFold(h.GetName(), extproc.HomeHeader) && h.GetPresentMatch() && h.GetInvertMatch()
	})
}

func checkHomeRoutes(fronts []homeFront) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	var homeTimeouts []time.Duration
	var receivers []homeFront
	for _, f := range fronts {
		internal := slices.ContainsFunc(f.rc.GetInternalOnlyHeaders(), func(h string) bool { return strings.EqualFold(h, extproc.HomeHeader) })
		switch {
		case len(f.homeRoutes) > 0 && !internal:
			fail("listener %s routes on %s but does not list it in internal_only_headers: a client could choose a region's route", f.listener, extproc.HomeHeader)
		case len(f.homeRoutes) == 0 && !internal:
			receivers = append(receivers, f)
			if !f.mtls {
				fail("listener %s keeps %s from its clients (the front other regions send home to) and requires no client certificate: anyone could forge the mark", f.listener, extproc.HomeHeader)
			}
		}
		if len(f.homeRoutes) > 0 {
			for _, vh := range f.rc.GetVirtualHosts() {
				for _, r := range vh.GetRoutes() {
					if disabled, _ := extProcDisabled(r.GetTypedPerFilterConfig()); disabled || f.homeRoutes[r.GetName()] != nil || refusesMarked(r) {
						continue
					}
					fail("listener %s route %s takes a request marked with %s: one marked for a region without a home route would run here unprotected; match the header's absence (present_match, invert_match)",
						f.listener, r.GetName(), extproc.HomeHeader)
				}
			}
			if a := f.extProc.GetRouteCacheAction(); a == extprocv3.ExternalProcessor_RETAIN || f.extProc.GetDisableClearRouteCache() {
				fail("listener %s: the ext_proc filter keeps the route cache (route_cache_action %v, disable_clear_route_cache %v): the home routes are never selected",
					f.listener, a, f.extProc.GetDisableClearRouteCache())
			}
			for _, r := range f.homeRoutes {
				homeTimeouts = append(homeTimeouts, r.GetRoute().GetTimeout().AsDuration())
			}
		}
	}
	if len(receivers) == 0 {
		fail("no listener keeps %s for the requests other regions send home", extproc.HomeHeader)
	}
	shortest := slices.Min(homeTimeouts)
	for _, f := range receivers {
		for _, vh := range f.rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				if disabled, _ := extProcDisabled(r.GetTypedPerFilterConfig()); disabled || r.GetRoute().GetTimeout() == nil {
					continue
				}
				if life := maxProtectedLifetime(r.GetRoute().GetTimeout().AsDuration(), f.extProc); life >= shortest {
					fail("listener %s route %s: its timeout with the ext_proc phases is %v, not under the home routes' %v: the sending Envoy would give up first",
						f.listener, r.GetName(), life, shortest)
				}
			}
		}
	}
	return errors.Join(errs...)
}

func init() {
	k8sDecoders["networking.istio.io/v1/ServiceEntry"] = func(j []byte) (any, error) {
		o := &istionetv1.ServiceEntry{}
		return o, decodeIstio(j, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
	}
}

// regionsComponents are the components that send requests home, each with
// the example it is written for (whose routes it patches, over that
// example's overlay); no overlay uses them.
var regionsComponents = map[string]string{"regions-istio": "orders-istio", "regions-envoy-gateway": "orders-envoy-gateway"}

// componentBuild writes, in fsys, a kustomization as a user's would be:
// resources the example's overlay and the example, components the
// component; it returns its directory.
func componentBuild(t *testing.T, fsys filesys.FileSystem, component string) string {
	t.Helper()
	example := regionsComponents[component]
	dir := path.Join(k8sDir, "with-"+component)
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
		"resources:\n- ../overlays/" + exampleOverlays[example] + "\n- ../examples/" + example +
		"\ncomponents:\n- ../components/" + component + "\n"
	if err := fsys.WriteFile("/"+dir+"/kustomization.yaml", []byte(k)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// withComponent builds the example with component added (componentBuild) and
// checks the server in it.
func withComponent(t *testing.T, fsys filesys.FileSystem, component string) []k8sObject {
	t.Helper()
	objs, err := buildObjects(fsys, componentBuild(t, fsys, component))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkServerObjects(objs); err != nil {
		t.Fatal(err)
	}
	srv, err := findServer(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(srv.cfg.RegionSendHome) == 0 || srv.cfg.Region == "" {
		t.Errorf("the server does not send requests home (region %q, send home %v)", srv.cfg.Region, srv.cfg.RegionSendHome)
	}
	return objs
}

// TestRegionsIstioComponent: k8s/components/regions-istio, on the Istio
// overlay, passes the overlay's checks and keeps TestHomeRoutes' promises
// in Istio's terms: the public gateway port strips the home header
// (a ROUTE_CONFIGURATION MERGE of internal_only_headers), the orders
// VirtualService routes it to each other region before its write route,
// and the port other regions send home to requires their client
// certificates and has no route on the header.
func TestRegionsIstioComponent(t *testing.T) {
	objs := withComponent(t, loadK8s(t), "regions-istio")
	if err := checkIstioObjects(objs); err != nil {
		t.Fatal(err)
	}
	stripped := map[uint32]bool{}
	for _, ef := range objectsOf[istionetv1a3.EnvoyFilter](objs) {
		for _, cp := range ef.Spec.GetConfigPatches() {
			if cp.GetApplyTo() != istioapi.EnvoyFilter_ROUTE_CONFIGURATION {
				continue
			}
			b, _ := protojson.Marshal(cp.GetPatch().GetValue())
			rc := &routev3.RouteConfiguration{}
			if err := protojson.Unmarshal(b, rc); err == nil && slices.Contains(rc.GetInternalOnlyHeaders(), extproc.HomeHeader) {
				stripped[cp.GetMatch().GetRouteConfiguration().GetPortNumber()] = true
			}
		}
	}
	servers := map[string]*istioapi.Server{} // gateway name -> its server
	for _, gw := range objectsOf[istionetv1.Gateway](objs) {
		for _, s := range gw.Spec.GetServers() {
			servers[gw.Name] = s
		}
	}
	for _, vs := range objectsOf[istionetv1.VirtualService](objs) {
		homes, write := 0, -1
		for i, r := range vs.Spec.GetHttp() {
			for _, m := range r.GetMatch() {
				if m.GetHeaders()[extproc.HomeHeader] != nil {
					homes++
					if write >= 0 {
						t.Errorf("VirtualService %s: home route %s after the write route: never taken", vs.Name, r.GetName())
					}
				}
			}
			if slices.ContainsFunc(r.GetMatch(), func(m *istioapi.HTTPMatchRequest) bool { return m.GetWithoutHeaders()[extproc.HomeHeader] != nil }) && write < 0 {
				write = i
			}
		}
		for _, g := range vs.Spec.GetGateways() {
			s := servers[g]
			if s == nil {
				continue
			}
			switch port := s.GetPort().GetNumber(); {
			case homes > 0 && !stripped[port]:
				t.Errorf("VirtualService %s routes on %s at port %d, which does not strip it from clients", vs.Name, extproc.HomeHeader, port)
			case homes == 0 && !stripped[port] && s.GetTls().GetMode() != istioapi.ServerTLSSettings_MUTUAL:
				t.Errorf("gateway %s port %d keeps %s from clients without requiring their certificates", g, port, extproc.HomeHeader)
			}
		}
		if vs.Name == "orders" && (homes != 2 || write < 0) {
			t.Errorf("VirtualService orders has %d home routes (want one per other region, 2), and its write route takes marked requests: %v", homes, write < 0)
		}
	}
}

func init() {
	k8sDecoders["gateway.envoyproxy.io/v1alpha1/Backend"] = strictAs[egv1a1.Backend]
	k8sDecoders["gateway.networking.k8s.io/v1/Gateway"] = strictAs[gwv1.Gateway]
}

// TestRegionsEnvoyGatewayComponent: k8s/components/regions-envoy-gateway,
// on the Envoy Gateway overlay, passes the overlay's checks and keeps
// TestHomeRoutes' promises in Envoy Gateway's terms: the public Gateway
// removes the home header from clients before routing (a
// ClientTrafficPolicy's earlyRequestHeaders), the write route has a rule
// per other region that outranks its write rule (the same methods, plus
// the header), and eg-home, which keeps the header, requires client
// certificates, has no rule on the header, and has the ext_proc filter.
func TestRegionsEnvoyGatewayComponent(t *testing.T) {
	objs := withComponent(t, loadK8s(t), "regions-envoy-gateway")
	if err := checkEnvoyGatewayObjects(objs); err != nil {
		t.Fatal(err)
	}
	stripped, mtls := map[string]bool{}, map[string]bool{}
	for _, ctp := range objectsOf[egv1a1.ClientTrafficPolicy](objs) {
		for _, ref := range ctp.Spec.TargetRefs {
			if h := ctp.Spec.Headers; h != nil && h.EarlyRequestHeaders != nil && slices.Contains(h.EarlyRequestHeaders.Remove, extproc.HomeHeader) {
				stripped[string(ref.Name)] = true
			}
			if requiresClientCertEG(ctp.Spec.TLS) {
				mtls[string(ref.Name)] = true
			}
		}
	}
	targeted := map[string]bool{}
	for _, p := range objectsOf[egv1a1.EnvoyExtensionPolicy](objs) {
		for _, ref := range p.Spec.TargetRefs {
			targeted[string(ref.Name)] = true
		}
	}
	homeRules := 0
	for _, r := range objectsOf[gwv1.HTTPRoute](objs) {
		for _, pr := range r.Spec.ParentRefs {
			gw := string(pr.Name)
			routes := 0
			for _, rule := range r.Spec.Rules {
				onHeader := false
				for _, m := range rule.Matches {
					if slices.ContainsFunc(m.Headers, func(h gwv1.HTTPHeaderMatch) bool { return strings.EqualFold(string(h.Name), extproc.HomeHeader) }) {
						onHeader = true
						if m.Method == nil {
							t.Errorf("HTTPRoute %s: a home match without a method is outranked by the write rule's method matches", r.Name)
						}
					}
				}
				if onHeader {
					routes++
				}
			}
			homeRules += routes
			switch {
			case routes > 0 && !stripped[gw]:
				t.Errorf("HTTPRoute %s routes on %s through Gateway %s, which does not remove it from clients", r.Name, extproc.HomeHeader, gw)
			case routes == 0 && !stripped[gw] && !mtls[gw]:
				t.Errorf("Gateway %s keeps %s from clients without requiring their certificates", gw, extproc.HomeHeader)
			case routes == 0 && !stripped[gw] && !targeted[r.Name]:
				t.Errorf("HTTPRoute %s takes requests sent home without the ext_proc filter", r.Name)
			}
		}
	}
	if homeRules != 2 {
		t.Errorf("%d home rules, want one per other region (2)", homeRules)
	}
}

// requiresClientCertEG reports whether a ClientTrafficPolicy's TLS requires
// and verifies the client's certificate: a CA to verify it against, and the
// mode RequireAndVerify (the default when unset). The deprecated optional
// flag must stay unset too.
func requiresClientCertEG(tls *egv1a1.ClientTLSSettings) bool {
	if tls == nil || tls.ClientValidation == nil || len(tls.ClientValidation.CACertificateRefs) == 0 {
		return false
	}
	cv := tls.ClientValidation
	//lint:ignore SA1019 the deprecated field must stay unset: it is what is checked.
	if cv.Optional {
		return false
	}
	return cv.Mode == nil || *cv.Mode == egv1a1.ClientValidationRequireAndVerify
}

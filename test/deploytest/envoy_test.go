package deploytest

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/testing/envoysim"
)

// recommendedClientTimeout is the client timeout docs/deployment.md asks
// for. Every protected route must be able to finish inside it, so that
// Envoy, not a client that gave up, sees how each attempt ended.
const recommendedClientTimeout = 15 * time.Second

// Names the configurations must use.
const (
	routerFilterName     = "envoy.filters.http.router"
	jwtFilterName        = "envoy.filters.http.jwt_authn"
	httpProtocolOptsName = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// readOnlyMethods may have the filter disabled; any other method may write.
var (
	readOnlyMethods = []string{"GET", "HEAD", "OPTIONS"}
	httpMethods     = []string{"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE", "TRACE", "CONNECT"}
)

// repoRoot is the repository's top directory.
const repoRoot = "../.."

// envoyConfigFiles lists every Envoy configuration shipped under envoy/.
func envoyConfigFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, "envoy", pat))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	slices.Sort(files)
	if len(files) == 0 {
		t.Fatal("no Envoy configurations under envoy/")
	}
	return files
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEnvoyConfigs decodes every envoy/*.yaml strictly into a Bootstrap,
// validates it and every typed_config inside it, and checks the ext_proc
// filter, its cluster and the routes against what the server needs.
func TestEnvoyConfigs(t *testing.T) {
	for _, path := range envoyConfigFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			if _, err := checkEnvoyConfig(readFile(t, path)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// envoyConfig is a checked bootstrap and the parts the tests look at.
type envoyConfig struct {
	bootstrap *bootstrapv3.Bootstrap
	clusters  map[string]*clusterv3.Cluster
	hcms      []*protectedHCM
}

// protectedHCM is an HTTP connection manager with the ext_proc filter.
type protectedHCM struct {
	hcm     *hcmv3.HttpConnectionManager
	extProc *extprocv3.ExternalProcessor
	filters []string
}

// checkEnvoyConfig decodes one Envoy bootstrap file strictly and reports
// every problem found in it.
func checkEnvoyConfig(data []byte) (*envoyConfig, error) {
	b := &bootstrapv3.Bootstrap{}
	if err := decodeEnvoyYAML(data, b); err != nil {
		return nil, err
	}
	cfg := &envoyConfig{bootstrap: b, clusters: map[string]*clusterv3.Cluster{}}
	var errs []error
	needs, err := examplePolicyNeeds()
	if err != nil {
		return nil, err
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		cfg.clusters[c.GetName()] = c
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm, err := typedConfig[*hcmv3.HttpConnectionManager](f.GetTypedConfig())
				if err != nil {
					continue // not an HTTP connection manager
				}
				p, err := checkHCM(cfg, hcm)
				if err != nil {
					errs = append(errs, fmt.Errorf("listener %s: %w", l.GetName(), err))
				}
				if p != nil {
					cfg.hcms = append(cfg.hcms, p)
					if err := checkFilterServes(p.extProc, needs, idem.DefaultStoreTimeout); err != nil {
						errs = append(errs, fmt.Errorf("listener %s: ext_proc filter: %w", l.GetName(), err))
					}
				}
			}
		}
		// Envoy's own default is 1 MiB (listener.proto
		// per_connection_buffer_limit_bytes); the policies' bodies must fit.
		if lim, body := l.GetPerConnectionBufferLimitBytes(), max(needs.maxBody, policy.DefaultMaxBody); lim != nil && int(lim.GetValue()) < body {
			errs = append(errs, fmt.Errorf("listener %s: per_connection_buffer_limit_bytes %d is below the policies' %d-byte bodies",
				l.GetName(), lim.GetValue(), body))
		}
	}
	if len(cfg.hcms) == 0 {
		errs = append(errs, errors.New("no HTTP connection manager with the ext_proc filter"))
	}
	return cfg, errors.Join(errs...)
}

// checkHCM checks the filter chain, the ext_proc filter, its cluster and
// the routes of one connection manager.
func checkHCM(cfg *envoyConfig, hcm *hcmv3.HttpConnectionManager) (*protectedHCM, error) {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	p := &protectedHCM{hcm: hcm}
	var jwt *jwtv3.JwtAuthentication
	for _, f := range hcm.GetHttpFilters() {
		p.filters = append(p.filters, f.GetName())
		switch f.GetName() {
		case extProcFilterName:
			ep, err := typedConfig[*extprocv3.ExternalProcessor](f.GetTypedConfig())
			if err != nil {
				fail("%s: %v", f.GetName(), err)
				continue
			}
			p.extProc = ep
		case jwtFilterName:
			j, err := typedConfig[*jwtv3.JwtAuthentication](f.GetTypedConfig())
			if err != nil {
				fail("%s: %v", f.GetName(), err)
				continue
			}
			jwt = j
		}
	}
	if p.extProc == nil {
		return nil, nil
	}
	if err := checkExtProc(p.extProc); err != nil {
		fail("ext_proc filter: %w", err)
	}
	if n := len(p.filters); p.filters[n-1] != routerFilterName {
		fail("the last HTTP filter is %s, want %s", p.filters[n-1], routerFilterName)
	}
	if i := slices.Index(p.filters, jwtFilterName); i > slices.Index(p.filters, extProcFilterName) {
		fail("jwt_authn runs after ext_proc: the server would see unverified principals")
	}
	if slices.Contains(p.extProc.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), jwtFilterName) {
		if jwt == nil {
			fail("ext_proc forwards %s metadata but there is no jwt_authn filter", jwtFilterName)
		}
		for name, prov := range jwt.GetProviders() {
			if prov.GetPayloadInMetadata() == "" {
				fail("jwt provider %s sets no payload_in_metadata: nothing to forward", name)
			}
		}
	}
	if err := checkExtProcCluster(cfg.clusters[extProcCluster(p.extProc)], extProcCluster(p.extProc)); err != nil {
		errs = append(errs, err)
	}
	if jwt != nil {
		for name, prov := range jwt.GetProviders() {
			if c := prov.GetRemoteJwks().GetHttpUri().GetCluster(); c != "" && cfg.clusters[c] == nil {
				fail("jwt provider %s fetches keys from undefined cluster %q", name, c)
			}
		}
	}
	if err := checkRoutes(cfg, hcm.GetRouteConfig(), p.extProc); err != nil {
		errs = append(errs, err)
	}
	return p, errors.Join(errs...)
}

// checkExtProcCluster checks the cluster the ext_proc filter calls: gRPC
// needs HTTP/2, and a protected request must not wait on a dead server.
func checkExtProcCluster(c *clusterv3.Cluster, name string) error {
	if c == nil {
		return fmt.Errorf("ext_proc cluster %q is not defined", name)
	}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("ext_proc cluster %s: "+format, append([]any{name}, args...)...))
	}
	opts, ok := c.GetTypedExtensionProtocolOptions()[httpProtocolOptsName]
	if !ok {
		fail("no typed_extension_protocol_options[%s]: Envoy would speak HTTP/1.1 to a gRPC server", httpProtocolOptsName)
	} else if hpo, err := typedConfig[*upstreamhttpv3.HttpProtocolOptions](opts); err != nil {
		fail("%v", err)
	} else if hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		fail("protocol options do not select HTTP/2 explicitly (explicit_http_config.http2_protocol_options)")
	}
	if ct := c.GetConnectTimeout(); ct == nil || ct.AsDuration() > time.Second {
		fail("connect_timeout %v: set it, at most 1s, so a dead server fails fast", ct.AsDuration())
	}
	grpcHC := false
	for _, hc := range c.GetHealthChecks() {
		grpcHC = grpcHC || hc.GetGrpcHealthCheck() != nil
	}
	if !grpcHC {
		fail("no gRPC health check: the server serves grpc.health.v1 on its ext_proc port")
	}
	th := c.GetCircuitBreakers().GetThresholds()
	if len(th) == 0 || th[0].GetMaxRequests() == nil {
		fail("no circuit breaker max_requests: one ext_proc stream is one request, size it explicitly")
	}
	return errors.Join(errs...)
}

// retryArmingHeaders are the request headers that make Envoy's router
// retry a route that has no retry policy: RetryStateImpl::create makes a
// retry state when either is present (source/common/router/
// retry_state_impl.cc); x-envoy-max-retries and the hedging and per-try
// headers act only through that state. The connection manager removes
// them only from clients it does not count as internal
// (conn_manager_utility.cc cleanInternalHeaders; internal_address_config),
// so a protected route removes them itself: Filter::decodeHeaders applies
// the route's, virtual host's and route configuration's
// request_headers_to_remove (finalizeRequestHeaders) before it calls
// createRetryState (source/common/router/router.cc).
var retryArmingHeaders = []string{"x-envoy-retry-on", "x-envoy-retry-grpc-on"}

// retryHeadersKept returns the retry-arming headers a route's removal list
// leaves in place.
func retryHeadersKept(removed []string) []string {
	var kept []string
	for _, h := range retryArmingHeaders {
		if !slices.ContainsFunc(removed, func(n string) bool { return strings.EqualFold(n, h) }) {
			kept = append(kept, h)
		}
	}
	return kept
}

// checkRoutes applies the route rules of docs/deployment.md: read-only
// routes disable the filter, and only they; protected routes have an
// explicit timeout that, with the ext_proc phases, fits inside the
// recommended client timeout; no Envoy retries on protected routes, from
// the route, its virtual host or the clusters it sends to.
func checkRoutes(cfg *envoyConfig, rc *routev3.RouteConfiguration, ep *extprocv3.ExternalProcessor) error {
	if rc == nil {
		return errors.New("no static route_config: the route rules cannot be checked")
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	disabledSomewhere := false
	protectedBy := map[string][]string{} // cluster -> the protected routes that send to it
	for _, vh := range rc.GetVirtualHosts() {
		if vh.GetRetryPolicy() != nil {
			fail("virtual host %s: retry_policy would re-send writes past the ext_proc filter", vh.GetName())
		}
		for _, r := range vh.GetRoutes() {
			name := vh.GetName() + "/" + r.GetName()
			if r.GetName() == "" {
				fail("route %d of %s has no name: the policy matches on xds.route_name", slices.Index(vh.GetRoutes(), r), vh.GetName())
			}
			disabled, err := extProcDisabled(r.GetTypedPerFilterConfig())
			if err != nil {
				fail("route %s: %v", name, err)
			}
			methods, err := routeMethods(r)
			if err != nil {
				fail("route %s: %v", name, err)
			}
			clusters := routeClusters(cfg, r)
			for _, c := range clusters {
				if cfg.clusters[c] == nil {
					fail("route %s: undefined cluster %q", name, c)
				}
			}
			if disabled {
				disabledSomewhere = true
				for _, m := range methods {
					if !slices.Contains(readOnlyMethods, m) {
						fail("route %s disables ext_proc but matches %s, which may write", name, m)
					}
				}
				continue
			}
			if r.GetRoute().GetRetryPolicy() != nil {
				fail("route %s: retry_policy would re-send writes past the ext_proc filter", name)
			}
			for _, h := range retryHeadersKept(slices.Concat(r.GetRequestHeadersToRemove(), vh.GetRequestHeadersToRemove(), rc.GetRequestHeadersToRemove())) {
				fail("route %s: a client's %s would arm router retries that re-send writes past the ext_proc filter; add it to the route's request_headers_to_remove", name, h)
			}
			for _, c := range clusters {
				protectedBy[c] = append(protectedBy[c], name)
			}
			if requestOnly, err := checkRequestOnlyRoute(r, methods); requestOnly || err != nil {
				if err != nil {
					fail("route %s: %v", name, err)
				}
				continue // its answer is never stored: no route timeout needed
			}
			to := r.GetRoute().GetTimeout()
			if to == nil || to.AsDuration() <= 0 {
				fail("route %s: set an explicit, finite route timeout (the route-timeout rule)", name)
				continue
			}
			life := maxProtectedLifetime(to.AsDuration(), ep)
			if life >= recommendedClientTimeout {
				fail("route %s: timeout %v plus four message_timeouts and max_message_timeout is %v, not under the %v client timeout (docs/envoy.md, a protected request's time in Envoy)",
					name, to.AsDuration(), life, recommendedClientTimeout)
			}
			// No check of grpc_service.timeout against life: Envoy does not
			// apply it to the ext_proc stream. Filter::openStream builds the
			// stream's StreamOptions without a timeout (ext_proc.cc, 1.36
			// to main), and Grpc::AsyncStreamImpl::initialize takes the
			// deadline from StreamOptions only (source/common/grpc/
			// async_client_impl.cc; AsyncClientImpl reads no timeout from
			// the GrpcService). Early ext_proc passed it as the stream
			// timeout (Filter::openStream, client_->start(*this,
			// config_->grpcTimeout()), v3alpha), which is why
			// message_timeout exists (envoy PR #15339).
		}
	}
	if !disabledSomewhere {
		fail("no route disables the ext_proc filter: read-only routes should (ExtProcPerRoute.disabled)")
	}
	for _, c := range slices.Sorted(maps.Keys(protectedBy)) {
		if err := checkClusterRetries(cfg.clusters[c], c); err != nil {
			fail("%v (protected routes %s)", err, strings.Join(protectedBy[c], ", "))
		}
	}
	return errors.Join(errs...)
}

// routeClusters lists the clusters a route may send to: its cluster or its
// weighted clusters. A route that picks the cluster from the request
// (cluster_header, a cluster specifier plugin) may reach any cluster, so it
// gets them all.
func routeClusters(cfg *envoyConfig, r *routev3.Route) []string {
	a := r.GetRoute()
	switch {
	case a == nil:
		return nil // a redirect or a direct response: no upstream
	case a.GetCluster() != "":
		return []string{a.GetCluster()}
	case a.GetWeightedClusters() != nil:
		var out []string
		for _, wc := range a.GetWeightedClusters().GetClusters() {
			if n := wc.GetName(); n != "" && !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
		return out
	}
	return slices.Sorted(maps.Keys(cfg.clusters))
}

// checkClusterRetries refuses a retry policy on a cluster that protected
// routes send to. Since Envoy 1.37, HttpProtocolOptions.retry_policy
// (field 11, in typed_extension_protocol_options under
// httpProtocolOptsName) retries every request routed to the cluster and
// overrides the route's retry policy entirely (go-control-plane envoy
// v1.40.0 extensions/upstreams/http/v3/http_protocol_options.pb.go, from
// envoyproxy/envoy api/envoy/extensions/upstreams/http/v3/
// http_protocol_options.proto; changelogs/1.37.0.yaml; envoy test
// test/integration/cluster_http_protocol_options_integration_test.cc
// PrecedenceClusterOverridesRouteRetryPolicy). So a protected route with no
// retry_policy of its own still retries, past the ext_proc filter, when its
// cluster has one.
func checkClusterRetries(c *clusterv3.Cluster, name string) error {
	opts, ok := c.GetTypedExtensionProtocolOptions()[httpProtocolOptsName]
	if !ok {
		return nil
	}
	hpo, err := typedConfig[*upstreamhttpv3.HttpProtocolOptions](opts)
	if err != nil {
		return fmt.Errorf("cluster %s: %w", name, err)
	}
	if hpo.GetRetryPolicy() != nil {
		return fmt.Errorf("cluster %s: HttpProtocolOptions.retry_policy overrides the routes' and would re-send writes past the ext_proc filter", name)
	}
	return nil
}

// extProcDisabled reads a route's ExtProcPerRoute. Our files use
// "disabled: true", and overrides only as checkRequestOnlyRoute allows;
// any other override would need checkExtProc of its own.
func extProcDisabled(per map[string]*anypb.Any) (bool, error) {
	pr, err := extProcPerRoute(per)
	if err != nil || pr == nil {
		return false, err
	}
	if o := pr.GetOverrides(); o != nil && !requestOnlyOverrides(o) {
		return false, errors.New("ExtProcPerRoute.overrides is not checked by these tests beyond a processing_mode that checks the request and leaves the answer alone (checkRequestOnlyRoute); use disabled or nothing")
	}
	return pr.GetDisabled(), nil
}

// extProcPerRoute decodes a route's ExtProcPerRoute, nil when it has none.
func extProcPerRoute(per map[string]*anypb.Any) (*extprocv3.ExtProcPerRoute, error) {
	a, ok := per[extProcFilterName]
	if !ok {
		return nil, nil
	}
	return typedConfig[*extprocv3.ExtProcPerRoute](a)
}

// routeMethods lists the methods a route can match, from its :method
// header matchers.
func routeMethods(r *routev3.Route) ([]string, error) {
	methods := slices.Clone(httpMethods)
	for _, h := range r.GetMatch().GetHeaders() {
		if h.GetName() != ":method" {
			continue
		}
		var keep []string
		for _, m := range methods {
			ok, err := headerMatches(h, m)
			if err != nil {
				return nil, err
			}
			if ok {
				keep = append(keep, m)
			}
		}
		methods = keep
	}
	return methods, nil
}

// headerMatches evaluates the header matchers our files use.
func headerMatches(h *routev3.HeaderMatcher, v string) (bool, error) {
	var ok bool
	switch {
	case h.GetStringMatch() != nil:
		sm := h.GetStringMatch()
		s := v
		if sm.GetIgnoreCase() {
			s = strings.ToLower(s)
		}
		lower := func(x string) string {
			if sm.GetIgnoreCase() {
				return strings.ToLower(x)
			}
			return x
		}
		switch {
		case sm.GetSafeRegex() != nil:
			re, err := regexp.Compile(sm.GetSafeRegex().GetRegex())
			if err != nil {
				return false, fmt.Errorf("header %s: %w", h.GetName(), err)
			}
			loc := re.FindStringIndex(v) // Envoy's safe_regex must match the whole value
			ok = loc != nil && loc[0] == 0 && loc[1] == len(v)
		case sm.GetExact() != "":
			ok = s == lower(sm.GetExact())
		case sm.GetPrefix() != "":
			ok = strings.HasPrefix(s, lower(sm.GetPrefix()))
		default:
			return false, fmt.Errorf("header %s: string matcher %v is not evaluated by these tests", h.GetName(), sm)
		}
	default:
		return false, fmt.Errorf("header %s: matcher %v is not evaluated by these tests", h.GetName(), h)
	}
	return ok != h.GetInvertMatch(), nil
}

// superset returns want when have contains all of it, and have otherwise
// (so that a comparison with want shows what is missing).
func superset(have, want []string) []string {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return have
		}
	}
	return want
}

// TestEnvoyFilterMatchesRecommendedConfig keeps the shipped filter in step
// with envoysim.RecommendedConfig, the configuration the end-to-end tests
// run: same modes, override and failure settings, and attributes.
func TestEnvoyFilterMatchesRecommendedConfig(t *testing.T) {
	want := envoysim.RecommendedConfig()
	for _, path := range envoyConfigFiles(t) {
		cfg, err := checkEnvoyConfig(readFile(t, path))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, p := range cfg.hcms {
			got := proto.Clone(want).(*extprocv3.ExternalProcessor)
			got.ProcessingMode = p.extProc.GetProcessingMode()
			got.AllowModeOverride = p.extProc.GetAllowModeOverride()
			got.FailureModeAllow = p.extProc.GetFailureModeAllow()
			// The file may ask for more attributes than the simulator's
			// configuration (the mTLS identity, which the end-to-end tests
			// configure where they need it), never fewer.
			got.RequestAttributes = superset(p.extProc.GetRequestAttributes(), want.GetRequestAttributes())
			got.ResponseAttributes = superset(p.extProc.GetResponseAttributes(), want.GetResponseAttributes())
			if !proto.Equal(got, want) {
				t.Errorf("%s: the filter differs from envoysim.RecommendedConfig():\n got %v\nwant %v", path, got, want)
			}
		}
	}
}

// TestClusterRetryPolicyOnEveryRouteToIt: a cluster's retry policy is
// refused whichever way a protected route reaches the cluster (its
// cluster, one of its weighted clusters, a cluster named by a request
// header), and left alone on a cluster only read-only routes use.
func TestClusterRetryPolicyOnEveryRouteToIt(t *testing.T) {
	protocolOptions := func(retry *routev3.RetryPolicy) map[string]*anypb.Any {
		a, err := anypb.New(&upstreamhttpv3.HttpProtocolOptions{
			UpstreamProtocolOptions: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_{
				ExplicitHttpConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &upstreamhttpv3.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{},
				},
			},
			RetryPolicy: retry,
		})
		if err != nil {
			t.Fatal(err)
		}
		return map[string]*anypb.Any{httpProtocolOptsName: a}
	}
	disabled, err := anypb.New(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &envoyConfig{clusters: map[string]*clusterv3.Cluster{
		"plain":    {Name: "plain", TypedExtensionProtocolOptions: protocolOptions(nil)},
		"retrying": {Name: "retrying", TypedExtensionProtocolOptions: protocolOptions(&routev3.RetryPolicy{RetryOn: "5xx"})},
	}}
	read := &routev3.Route{
		Name: "read",
		Match: &routev3.RouteMatch{Headers: []*routev3.HeaderMatcher{{
			Name: ":method",
			HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
				MatchPattern: &matcherv3.StringMatcher_SafeRegex{SafeRegex: &matcherv3.RegexMatcher{Regex: "^(GET|HEAD|OPTIONS)$"}},
			}},
		}}},
		Action:               &routev3.Route_Route{Route: &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "retrying"}}},
		TypedPerFilterConfig: map[string]*anypb.Any{extProcFilterName: disabled},
	}
	write := func(a *routev3.RouteAction) *routev3.Route {
		a.Timeout = durationpb.New(10 * time.Second)
		return &routev3.Route{Name: "write", Action: &routev3.Route_Route{Route: a}}
	}
	for _, tc := range []struct {
		name   string
		action *routev3.RouteAction
		refuse bool
	}{
		{"cluster", &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "retrying"}}, true},
		{"weighted clusters", &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_WeightedClusters{WeightedClusters: &routev3.WeightedCluster{
			Clusters: []*routev3.WeightedCluster_ClusterWeight{{Name: "plain"}, {Name: "retrying"}},
		}}}, true},
		{"cluster_header", &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_ClusterHeader{ClusterHeader: "x-cluster"}}, true},
		{"a cluster without retries", &routev3.RouteAction{ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "plain"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := &routev3.RouteConfiguration{RequestHeadersToRemove: retryArmingHeaders, VirtualHosts: []*routev3.VirtualHost{{
				Name: "vh", Routes: []*routev3.Route{read, write(tc.action)},
			}}}
			err := checkRoutes(cfg, rc, envoysim.RecommendedConfig())
			switch {
			case tc.refuse && (err == nil || !strings.Contains(err.Error(), "cluster retrying: HttpProtocolOptions.retry_policy")):
				t.Fatalf("a protected route reaching a retrying cluster: got %v, want the cluster's retry_policy refused", err)
			case !tc.refuse && err != nil:
				t.Fatalf("retries on a cluster only a read-only route uses: %v", err)
			}
		})
	}
}

// TestRetryHeadersRemovedOnProtectedRoutes: a protected route must remove
// the two retry-arming headers itself, at the route, its virtual host or
// its route configuration (all three are applied by finalizeRequestHeaders
// before the router reads them), in any case of the names.
func TestRetryHeadersRemovedOnProtectedRoutes(t *testing.T) {
	cfg := &envoyConfig{clusters: map[string]*clusterv3.Cluster{"plain": {Name: "plain"}}}
	disabled, err := anypb.New(&extprocv3.ExtProcPerRoute{Override: &extprocv3.ExtProcPerRoute_Disabled{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	action := func() *routev3.Route_Route {
		return &routev3.Route_Route{Route: &routev3.RouteAction{
			ClusterSpecifier: &routev3.RouteAction_Cluster{Cluster: "plain"}, Timeout: durationpb.New(10 * time.Second)}}
	}
	read := &routev3.Route{Name: "read", Match: &routev3.RouteMatch{Headers: []*routev3.HeaderMatcher{{
		Name: ":method", HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{StringMatch: &matcherv3.StringMatcher{
			MatchPattern: &matcherv3.StringMatcher_Exact{Exact: "GET"}}},
	}}}, Action: action(), TypedPerFilterConfig: map[string]*anypb.Any{extProcFilterName: disabled}}
	both := []string{"X-Envoy-Retry-On", "x-envoy-retry-grpc-on"}
	for _, tc := range []struct {
		name              string
		route, vh, config []string
		kept              []string
	}{
		{"none", nil, nil, nil, retryArmingHeaders},
		{"one", []string{"x-envoy-retry-on"}, nil, nil, []string{"x-envoy-retry-grpc-on"}},
		{"route", both, nil, nil, nil},
		{"virtual host", nil, both, nil, nil},
		{"split between levels", both[:1], nil, both[1:], nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			write := &routev3.Route{Name: "write", Action: action(), RequestHeadersToRemove: tc.route}
			rc := &routev3.RouteConfiguration{RequestHeadersToRemove: tc.config, VirtualHosts: []*routev3.VirtualHost{{
				Name: "vh", Routes: []*routev3.Route{read, write}, RequestHeadersToRemove: tc.vh,
			}}}
			err := checkRoutes(cfg, rc, envoysim.RecommendedConfig())
			for _, h := range retryArmingHeaders {
				want := slices.Contains(tc.kept, h)
				if got := err != nil && strings.Contains(err.Error(), "client's "+h+" "); got != want {
					t.Errorf("%s refused: %v, want %v (%v)", h, got, want, err)
				}
			}
		})
	}
}

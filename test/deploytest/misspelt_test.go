package deploytest

import (
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// mutation changes a copy of one deployment file: the first occurrence of
// from becomes to. want is a word the error must contain (the misspelt
// field, or what a broken setting breaks), so that a test fails for the
// planted reason and not another.
type mutation struct {
	file     string // path from the repository root
	from, to string
	want     string
}

// misspellings plants one misspelt field in a copy of every deployment
// file (two in some): each must make its check fail. Misspellings inside
// embedded configurations (the ext_proc filter in an Istio patch), in
// JSON patches, and in letter case only are among them.
var misspellings = []mutation{
	{file: "envoy/envoy.yaml", from: "allow_mode_override:", to: "allow_mode_overide:"},
	{file: "envoy/envoy.yaml", from: "    disabled: true", to: "    disable: true"},
	{file: "envoy/envoy-jwt.yaml", from: "payload_in_metadata:", to: "payload_in_metdata:"},
	{file: "envoy/envoy-jwt.yaml", from: "max_message_timeout:", to: "max_message_timout:"},
	{file: "envoy/envoy-mcp.yaml", from: "idle_timeout: 3600s", to: "idle_timout: 3600s"},
	{file: "docker-compose.yml", from: "depends_on:", to: "depend_on:"},
	{file: "Dockerfile", from: "EXPOSE 50051", to: "EXPOZE 50051"},
	{file: "k8s/base/kustomization.yaml", from: "configMapGenerator:", to: "configMapGenerater:"},
	{file: "k8s/base/namespace.yaml", from: "  name: idem-extproc", to: "  name: idem-extproc\n  labelz: {a: b}"},
	{file: "k8s/base/serviceaccount.yaml", from: "automountServiceAccountToken:", to: "automountServiceAcountToken:"},
	{file: "k8s/base/policy.yaml", from: "retention:", to: "retension:"},
	{file: "k8s/base/deployment.yaml", from: "readinessProbe:", to: "readinessProbz:"},
	{file: "k8s/base/deployment.yaml", from: "readOnlyRootFilesystem:", to: "readonlyRootFilesystem:"},
	{file: "k8s/base/service.yaml", from: "appProtocol:", to: "appProtocl:"},
	{file: "k8s/base/pdb.yaml", from: "maxUnavailable:", to: "maxUnavailible:"},
	{file: "k8s/base/hpa.yaml", from: "minReplicas:", to: "minReplicaz:"},
	{file: "k8s/base/networkpolicy.yaml", from: "policyTypes:", to: "policyType:"},
	{file: "k8s/components/dev-redis/kustomization.yaml", from: "secretGenerator:", to: "secretGenerater:"},
	{file: "k8s/components/dev-keys/kustomization.yaml", from: "secretGenerator:", to: "secretGenerater:"},
	{file: "k8s/components/dev-redis/statefulset.yaml", from: "volumeClaimTemplates:", to: "volumeClaimTemplate:"},
	{file: "k8s/components/dev-redis/service.yaml", from: "targetPort:", to: "targetport:"},
	{file: "k8s/components/dev-redis/networkpolicy.yaml", from: "  podSelector:", to: "  podselector:"},
	{file: "k8s/overlays/dev/kustomization.yaml", from: "components:", to: "component:"},
	{file: "k8s/overlays/istio/kustomization.yaml", from: "patches:", to: "patchs:"},
	{file: "k8s/overlays/istio/networkpolicy-gateway.yaml", from: "namespaceSelector:", to: "namespaceSelecter:"},
	{file: "k8s/overlays/istio/envoyfilter-gateway.yaml", from: "workloadSelector:", to: "workloadSelecter:"},
	{file: "k8s/overlays/istio/envoyfilter-gateway.yaml", from: "allow_mode_override:", to: "allow_mode_overide:"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "subFilter:", to: "subfilter:"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "xds_matcher:", to: "xds_matchr:"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "header_name:", to: "headername:"},
	{file: "k8s/overlays/istio/destinationrule.yaml", from: "http2MaxRequests:", to: "http2MaxRequest:"},
	{file: "k8s/examples/orders-istio/gateway.yaml", from: "servers:", to: "server:"},
	{file: "k8s/examples/orders-istio/virtualservice.yaml", from: "retries:", to: "retrys:"},
	{file: "k8s/examples/orders-istio/envoyfilter-routes.yaml", from: "typed_per_filter_config:", to: "typed_per_filter_confg:"},
	{file: "k8s/examples/orders-istio/kustomization.yaml", from: "resources:", to: "resource:"},
	{file: "k8s/examples/orders-istio-sidecar/virtualservice-mesh.yaml", from: "gateways:", to: "gateway:"},
	{file: "k8s/examples/orders-istio-sidecar/kustomization.yaml", from: "resources:", to: "resource:"},
	{file: "k8s/examples/orders-envoy-gateway/kustomization.yaml", from: "resources:", to: "resource:"},
	{file: "k8s/overlays/envoy-gateway/kustomization.yaml", from: "resources:", to: "resource:"},
	{file: "k8s/overlays/envoy-gateway/networkpolicy-proxies.yaml", from: "podSelector:", to: "podSelecter:"},
	{file: "k8s/examples/orders-envoy-gateway/envoyextensionpolicy.yaml", from: "allowModeOverride:", to: "allowModeOveride:"},
	{file: "k8s/examples/orders-envoy-gateway/envoyextensionpolicy.yaml", from: "messageTimeout:", to: "messagetimeout:"},
	{file: "k8s/examples/orders-envoy-gateway/referencegrant.yaml", from: "    namespace: orders", to: "    namespce: orders"},
	{file: "k8s/examples/orders-envoy-gateway/httproutes.yaml", from: "timeouts:", to: "timeout:"},
	{file: "k8s/overlays/envoy-gateway/clienttrafficpolicy.yaml", from: "bufferLimit:", to: "bufferlimit:"},
	{file: "k8s/overlays/envoy-gateway/envoyproxy.yaml", from: "filterOrder:", to: "filterorder:"},
	{file: "envoy/envoy-regions.yaml", from: "internal_only_headers:", to: "internal_only_header:"},
	{file: "k8s/components/regions-istio/kustomization.yaml", from: "patches:", to: "patchs:"},
	{file: "k8s/components/regions-istio/envoyfilter-regions.yaml", from: "workloadSelector:", to: "workloadSelecter:"},
	{file: "k8s/components/regions-istio/orders-home.yaml", from: "credentialName:", to: "credentialNme:"},
	{file: "k8s/components/regions-istio/regions.yaml", from: "resolution:", to: "resolutin:"},
	{file: "k8s/components/regions-envoy-gateway/kustomization.yaml", from: "patches:", to: "patchs:"},
	{file: "k8s/components/regions-envoy-gateway/backends.yaml", from: "caCertificateRefs:", to: "caCertificateRef:"},
	{file: "k8s/components/regions-envoy-gateway/eg-home.yaml", from: "allowedRoutes:", to: "allowedRoute:"},
}

// TestMisspeltFieldFails plants each misspelling in a copy of its file and
// runs the file's check on the copy: every one must fail, naming the field.
func TestMisspeltFieldFails(t *testing.T) {
	for _, m := range misspellings {
		if m.want == "" {
			m.want = strings.TrimSpace(strings.Split(strings.TrimSpace(m.to[strings.LastIndex(m.to, "\n")+1:]), ":")[0])
			m.want = strings.Fields(m.want)[0]
		}
		t.Run(m.file+"/"+m.want, func(t *testing.T) {
			t.Parallel()
			expectMutationFails(t, m)
		})
	}
}

// TestEveryDeploymentFileHasAMisspellingCase keeps the table above
// complete: a new deployment file needs a case of its own.
func TestEveryDeploymentFileHasAMisspellingCase(t *testing.T) {
	covered := map[string]bool{}
	for _, m := range misspellings {
		covered[m.file] = true
	}
	for _, f := range deploymentFiles(t) {
		if !covered[f] {
			t.Errorf("%s has no case in misspellings", f)
		}
	}
}

// deploymentFiles lists every file the deployment tests cover, by path
// from the repository root.
func deploymentFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"Dockerfile", "docker-compose.yml"}
	for _, dir := range []string{"envoy", k8sDir} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(repoRoot, p)
			files = append(files, filepath.ToSlash(rel))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(files)
	return files
}

// expectMutationFails applies m to a copy of its file and runs the check
// that covers that file on the copy; the check must fail with m.want in
// its error.
func expectMutationFails(t *testing.T, m mutation) {
	t.Helper()
	orig := readFile(t, filepath.Join(repoRoot, m.file))
	changed, ok := replaceOutsideComments(string(orig), m.from, m.to)
	if !ok {
		t.Fatalf("%q does not occur in %s outside comments", m.from, m.file)
	}
	err := checkChangedFile(t, m.file, []byte(changed))
	if err == nil {
		t.Fatalf("%s with %q: the check passed", m.file, m.to)
	}
	if !strings.Contains(err.Error(), m.want) {
		t.Fatalf("%s with %q: failed, but not naming %q:\n%v", m.file, m.to, m.want, err)
	}
	t.Logf("failed as it should: %v", err)
}

// replaceOutsideComments replaces the first occurrence of from that is
// not on a comment line.
func replaceOutsideComments(s, from, to string) (string, bool) {
	for off := 0; ; {
		i := strings.Index(s[off:], from)
		if i < 0 {
			return s, false
		}
		i += off
		lineStart := strings.LastIndex(s[:i], "\n") + 1
		if !strings.HasPrefix(strings.TrimSpace(s[lineStart:i+len(from)]), "#") {
			return s[:i] + to + s[i+len(from):], true
		}
		off = i + len(from)
	}
}

// checkChangedFile runs the check that covers file, with data in place of
// the file's content.
func checkChangedFile(t *testing.T, file string, data []byte) error {
	t.Helper()
	readRepo := func(p string) ([]byte, error) {
		if path.Clean(p) == file {
			return data, nil
		}
		return os.ReadFile(filepath.Join(repoRoot, p))
	}
	switch {
	case strings.HasPrefix(file, "envoy/"):
		_, err := checkEnvoyConfig(data)
		if err == nil && file == "envoy/envoy.yaml" { // the compose file mounts it
			err = checkCompose(must(readRepo("docker-compose.yml")), readRepo)
		}
		return err
	case file == "docker-compose.yml":
		return checkCompose(data, readRepo)
	case file == "Dockerfile":
		_, err := checkDockerfile(data)
		return err
	case strings.HasPrefix(file, k8sDir+"/"):
		fsys := loadTree(t, k8sDir)
		if err := fsys.WriteFile("/"+file, data); err != nil {
			t.Fatal(err)
		}
		withTestImages(t, fsys) // after the change, which may be to a kustomization.yaml
		withExampleBuilds(t, fsys)
		dirs := kustomizationsWith(t, file)
		if component := strings.Split(file, "/")[2]; regionsComponents[component] != "" {
			// No overlay uses it: it is built on the example it is for.
			dirs = []string{componentBuild(t, fsys, component)}
		}
		// The first build that includes the file and fails is enough.
		for _, dir := range dirs {
			if err := checkKustomization(fsys, dir); err != nil {
				return err
			}
		}
		return nil
	}
	t.Fatalf("no check covers %s", file)
	return nil
}

// kustomizationsWith lists the kustomizations whose build includes file:
// an example's files are in that example's build only, an overlay's own
// in that overlay and its examples' builds, a component's in the overlays
// (which may use it) and the examples' builds, the base's in everything.
func kustomizationsWith(t *testing.T, file string) []string {
	t.Helper()
	all := append(kustomizations(t), exampleBuilds(t)...)
	parts := strings.Split(file, "/")
	switch parts[1] {
	case "examples":
		return []string{exampleBuild(parts[2])}
	case "overlays":
		dirs := []string{path.Join(k8sDir, "overlays", parts[2])}
		for example, overlay := range exampleOverlays {
			if overlay == parts[2] {
				dirs = append(dirs, exampleBuild(example))
			}
		}
		slices.Sort(dirs[1:])
		return dirs
	case "components":
		return slices.DeleteFunc(all, func(d string) bool { return d == path.Join(k8sDir, "base") })
	}
	return all
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// brokenSettings plant well-formed but wrong settings: the checks of what
// the server needs (not only the decoders) must catch each.
var brokenSettings = []mutation{
	{file: "envoy/envoy.yaml", from: "failure_mode_allow: false", to: "failure_mode_allow: true", want: "failure_mode_allow"},
	{file: "envoy/envoy.yaml", from: "message_timeout: 0.3s", to: "message_timeout: 0.15s", want: "message_timeout"},
	{file: "envoy/envoy.yaml", from: "response_body_mode: BUFFERED", to: "response_body_mode: STREAMED", want: "response_body_mode"},
	{file: "envoy/envoy.yaml", from: "- response.flags", to: "- response.code", want: "response.flags"},
	{file: "envoy/envoy.yaml", from: "              - upstream.request_attempt_count\n", to: "", want: "lacks upstream.request_attempt_count"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "              - upstream.request_attempt_count\n", to: "", want: "lacks upstream.request_attempt_count"},
	{file: "k8s/examples/orders-envoy-gateway/envoyextensionpolicy.yaml", from: "        - upstream.request_attempt_count\n", to: "", want: "lacks upstream.request_attempt_count"},
	{file: "envoy/envoy.yaml", from: "- xds.route_name", to: "- request.path", want: "xds.route_name"},
	{file: "envoy/envoy.yaml", from: "GET|HEAD|OPTIONS", to: "GET|HEAD|OPTIONS|POST", want: "POST"},
	{file: "envoy/envoy.yaml", from: "http2_protocol_options:\n            connection_keepalive:\n              interval: 30s\n              timeout: 5s",
		to: "http_protocol_options: {}", want: "HTTP/2"},
	{file: "envoy/envoy.yaml", from: "timeout: 10s\n                # A client's own", to: "timeout: 20s\n                # A client's own", want: "client timeout"},
	{file: "envoy/envoy.yaml", from: "request_headers_to_remove: [x-envoy-retry-on, x-envoy-retry-grpc-on]", to: "request_headers_to_remove: [x-envoy-retry-grpc-on]", want: "x-envoy-retry-on would arm router retries"},
	{file: "k8s/examples/orders-istio/virtualservice.yaml", from: "remove: [x-envoy-retry-on, x-envoy-retry-grpc-on]", to: "remove: [x-envoy-retry-on]", want: "x-envoy-retry-grpc-on would arm router retries"},
	{file: "k8s/examples/orders-envoy-gateway/httproutes.yaml", from: "remove: [x-envoy-retry-on, x-envoy-retry-grpc-on]", to: "remove: []", want: "x-envoy-retry-on would arm router retries"},
	{file: "envoy/envoy.yaml", from: "port_value: 50051", to: "port_value: 50052", want: "listens on 50051"},
	{file: "envoy/envoy.yaml", from: "max_message_timeout: 2.5s", to: "max_message_timeout: 1s", want: "max_message_timeout"},
	{file: "envoy/envoy-jwt.yaml", from: "              max_message_timeout: 2.5s\n", to: "", want: "max_message_timeout"},
	{file: "envoy/envoy.yaml", from: "- connection.uri_san_peer_certificate", to: "- source.principal", want: "source.principal is not an Envoy attribute"},
	{file: "envoy/envoy-jwt.yaml", from: "- connection.uri_san_peer_certificate", to: "- connection.dns_san_peer_certificate", want: "lacks connection.uri_san_peer_certificate"},
	{file: "envoy/envoy-jwt.yaml", from: "          - name: envoy.filters.http.jwt_authn", to: "          - name: envoy.filters.http.jwt_authn_off", want: "jwt_authn"},
	// A cluster-level retry policy (HttpProtocolOptions.retry_policy, Envoy
	// 1.37+) overrides the route's, so a protected route without one still
	// retries through its cluster.
	{file: "envoy/envoy.yaml", from: "  - name: orders\n    type: STRICT_DNS\n", to: "  - name: orders\n    type: STRICT_DNS\n" + clusterRetryPolicy,
		want: "cluster orders: HttpProtocolOptions.retry_policy"},
	{file: "envoy/envoy-mcp.yaml", from: "  - name: mcp_server\n    type: STRICT_DNS\n", to: "  - name: mcp_server\n    type: STRICT_DNS\n" + clusterRetryPolicy,
		want: "cluster mcp_server: HttpProtocolOptions.retry_policy"},
	// The subscriptions/listen route leaves its answer unprocessed, so only
	// a listen request of a validated revision may reach it, and only that
	// override is accepted.
	{file: "envoy/envoy-mcp.yaml", from: "string_match: { exact: subscriptions/listen }", to: "string_match: { prefix: subscriptions }",
		want: "leaves its answer unprocessed"},
	{file: "envoy/envoy-mcp.yaml", from: "{ regex: \"^(2026-07-(2[89]|3[01])|", to: "{ regex: \"^(2025-11-25|2026-07-(2[89]|3[01])|",
		want: "leaves its answer unprocessed"},
	{file: "envoy/envoy-mcp.yaml", from: "response_body_mode: NONE", to: "response_body_mode: BUFFERED", want: "ExtProcPerRoute.overrides"},
	// Envoy Gateway writes a route's retry_policy from the HTTPRoute rule's
	// retry and from a BackendTrafficPolicy's retry on the route or its
	// Gateway.
	{file: "k8s/examples/orders-envoy-gateway/httproutes.yaml", from: "    timeouts:\n      request: 10s\n---\n",
		to: "    timeouts:\n      request: 10s\n    retry:\n      attempts: 2\n---\n", want: "rule 0: retry"},
	{file: "k8s/examples/orders-envoy-gateway/httproutes.yaml", from: "    timeouts:\n      request: 10s\n---\n",
		to: "    timeouts:\n      request: 10s\n---\n" + egRetryPolicy("orders", "HTTPRoute", "orders-write"), want: "BackendTrafficPolicy orders/retries: retry"},
	{file: "k8s/examples/orders-envoy-gateway/httproutes.yaml", from: "    timeouts:\n      request: 10s\n---\n",
		to: "    timeouts:\n      request: 10s\n---\n" + egRetryPolicy("envoy-gateway-system", "Gateway", "eg"), want: "BackendTrafficPolicy envoy-gateway-system/retries: retry"},
	{file: "docker-compose.yml", from: "IDEM_STORE_TIMEOUT: 100ms", to: "IDEM_STORE_TIMEOUT: 250ms", want: "store-timeout"},
	{file: "docker-compose.yml", from: "IDEM_LOG_LEVEL:", to: "IDEM_LOGLEVEL:", want: "IDEM_LOGLEVEL"},
	{file: "Dockerfile", from: "-trimpath", to: "", want: "trimpath"},
	{file: "Dockerfile", from: "EXPOSE 50051 8081", to: "EXPOSE 50051 8081\nHEALTHCHECK CMD [\"/x\"]", want: "HEALTHCHECK"},
	{file: "k8s/base/kustomization.yaml", from: "IDEM_STORE_TIMEOUT=100ms", to: "IDEM_STORE_TIMEOUT=250ms", want: "store-timeout"},
	{file: "k8s/base/policy.yaml", from: "lease: 30s", to: "lease: 48h", want: "shorter than retention"},
	{file: "k8s/base/policy.yaml", from: "encrypt: true", to: "encrypt: false", want: "stores responses in the clear"},
	{file: "k8s/base/kustomization.yaml", from: "  - IDEM_ENCRYPTION_KEYS_FILE=/etc/idem-extproc-keys/keys\n", to: "", want: "encrypt"},
	{file: "k8s/base/deployment.yaml", from: "mountPath: /etc/idem-extproc-keys", to: "mountPath: /etc/keys-elsewhere", want: "mounted Secret"},
	{file: "k8s/base/deployment.yaml", from: "path: /readyz", to: "path: /healthz", want: "readiness"},
	{file: "k8s/base/deployment.yaml", from: "runAsNonRoot: true", to: "runAsNonRoot: false", want: "runAsNonRoot"},
	{file: "k8s/base/service.yaml", from: "appProtocol: grpc", to: "appProtocol: http", want: "appProtocol grpc"},
	{file: "k8s/components/dev-redis/statefulset.yaml", from: "- noeviction", to: "- allkeys-lru", want: "noeviction"},
	{file: "k8s/examples/orders-istio/virtualservice.yaml", from: "attempts: 0", to: "attempts: 2", want: "orders-write: retries.attempts 2"},
	// Istio's default when retries is unset: 2 retries.
	{file: "k8s/examples/orders-istio/virtualservice.yaml", from: "    timeout: 10s\n    retries:\n      attempts: 0\n", to: "    timeout: 10s\n",
		want: "orders-write: no retries"},
	{file: "k8s/examples/orders-istio-sidecar/virtualservice-mesh.yaml", from: "  - name: orders-mesh\n    route:\n    - destination:\n        host: orders.orders.svc.cluster.local\n        port:\n          number: 8080\n    timeout: 10s\n    retries:\n      attempts: 0\n",
		to:   "  - name: orders-mesh\n    route:\n    - destination:\n        host: orders.orders.svc.cluster.local\n        port:\n          number: 8080\n    timeout: 10s\n",
		want: "orders-mesh: no retries"},
	{file: "k8s/overlays/istio/envoyfilter-gateway.yaml", from: "idem-extproc.idem-extproc.svc", to: "idem.idem-extproc.svc", want: "no Service"},
	{file: "k8s/overlays/istio/envoyfilter-gateway.yaml", from: "        disabled: true\n", to: "", want: "runs on every route through the gateway"},
	{file: "k8s/examples/orders-istio/envoyfilter-routes.yaml", from: "name: orders-write", to: "name: orders-read", want: "matches POST, which may write, and the gateway's ext_proc filter does not run on it"},
	{file: "k8s/examples/orders-istio/envoyfilter-routes.yaml", from: "name: orders-write", to: "name: orders-writes", want: "names route orders-writes (virtual host \"orders.example.com:80\"), which no VirtualService"},
	{file: "k8s/examples/orders-istio/envoyfilter-routes.yaml", from: "name: orders.example.com:80", to: "name: orders.example.com:8080", want: "which no VirtualService bound to a Gateway in the build has"},
	{file: "k8s/examples/orders-istio/envoyfilter-routes.yaml", from: "config: {}", to: "disabled: true", want: "the gateway's ext_proc filter does not run on it"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "        portNumber: 8080\n", to: "", want: "matches every inbound port of the workload"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "value_match: { exact: GET }", to: "value_match: { exact: POST }", want: "skips the filter for POST, which may write"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "value_match: { exact: HEAD }", to: "value_match: { exact: HAED }", want: "the sidecar filter runs for HEAD"},
	{file: "k8s/examples/orders-istio-sidecar/envoyfilter-sidecar.yaml", from: "- connection.uri_san_peer_certificate", to: "- source.principal", want: "source.principal is not an Envoy attribute"},
	{file: "k8s/overlays/istio/kustomization.yaml", from: "terminationDrainDuration: 20s", to: "terminationDrainDuration: 10s", want: "drains for 10s"},
	{file: "k8s/overlays/istio/kustomization.yaml", from: "proxy.istio.io/config: |", to: "proxy.istio.io/confg: |", want: "drains for 5s"},
	{file: "k8s/examples/orders-istio-sidecar/virtualservice-mesh.yaml", from: "  - mesh", to: "  - orders-gateway", want: "bound to the mesh"},
	{file: "k8s/examples/orders-envoy-gateway/envoyextensionpolicy.yaml", from: "body: Buffered", to: "body: Streamed", want: "request_body_mode"},
	{file: "k8s/examples/orders-envoy-gateway/envoyextensionpolicy.yaml", from: "body: Buffered", to: "body: Bufered", want: "Bufered"},
	{file: "k8s/examples/orders-envoy-gateway/envoyextensionpolicy.yaml", from: "name: orders-write", to: "name: orders-read", want: "no EnvoyExtensionPolicy protects it"},
	{file: "k8s/examples/orders-envoy-gateway/referencegrant.yaml", from: "namespace: orders", to: "namespace: shop", want: "ReferenceGrant"},
	{file: "k8s/overlays/envoy-gateway/clienttrafficpolicy.yaml", from: "bufferLimit: 1Mi", to: "bufferLimit: 32Ki", want: "a larger protected request gets 413"},
	{file: "k8s/overlays/envoy-gateway/clienttrafficpolicy.yaml", from: "    name: eg", to: "    name: other", want: "32768 bytes (Envoy Gateway's default)"},
	{file: "k8s/overlays/envoy-gateway/kustomization.yaml", from: "- clienttrafficpolicy.yaml\n", to: "", want: "Envoy Gateway's default"},
	{file: "k8s/overlays/envoy-gateway/envoyproxy.yaml", from: "after: envoy.filters.http.ratelimit", to: "after: envoy.filters.http.cors", want: "envoy.filters.http.ratelimit runs after envoy.filters.http.ext_proc"},
	{file: "k8s/overlays/envoy-gateway/kustomization.yaml", from: "- envoyproxy.yaml\n", to: "", want: "no EnvoyProxy"},
	{file: "k8s/examples/orders-envoy-gateway/envoyextensionpolicy.yaml", from: "- connection.uri_san_peer_certificate", to: "- source.principal", want: "source.principal is not an Envoy attribute"},
	{file: "k8s/base/policy.yaml", from: "  store_failure: fail_closed\n", to: "  store_failure: fail_closed\n  wait_for_in_flight: 1s\n", want: "Envoy Gateway cannot serve"},
	{file: "k8s/base/policy.yaml", from: "max_request_body: 1MiB", to: "max_request_body: 4MiB", want: "4194304-byte bodies"},
}

// TestBrokenSettingFails plants each broken setting in a copy of its file:
// the check must fail for that reason.
func TestBrokenSettingFails(t *testing.T) {
	for _, m := range brokenSettings {
		t.Run(m.file+"/"+m.want, func(t *testing.T) {
			t.Parallel()
			expectMutationFails(t, m)
		})
	}
}

// clusterRetryPolicy is the typed_extension_protocol_options of a cluster
// that retries every request it carries: the Envoy 1.37 field
// HttpProtocolOptions.retry_policy.
const clusterRetryPolicy = `    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http_protocol_options: {}
        retry_policy:
          retry_on: 5xx,reset
          num_retries: 2
`

// egRetryPolicy is a BackendTrafficPolicy document that retries the
// requests of its target (Envoy Gateway's own default: 2 retries).
func egRetryPolicy(namespace, kind, name string) string {
	return `apiVersion: gateway.envoyproxy.io/v1alpha1
kind: BackendTrafficPolicy
metadata:
  name: retries
  namespace: ` + namespace + `
spec:
  targetRefs:
  - group: gateway.networking.k8s.io
    kind: ` + kind + `
    name: ` + name + `
  retry:
    retryOn:
      triggers: [connect-failure, reset]
---
`
}

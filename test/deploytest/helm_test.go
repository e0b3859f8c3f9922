package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	//lint:ignore SA1019 the deprecated jsonpb is the decoder Istio's own types use (as in decodeIstio).
	"github.com/golang/protobuf/jsonpb"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	istioannotation "istio.io/api/annotation"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	istionetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
)

// chartDir is the Helm chart; its ci/ directory holds the values files
// every test renders it with (chart-testing's convention).
const chartDir = "charts/idem-extproc"

// The Prometheus Operator's kinds, in the chart and in the kustomize
// component k8s/components/prometheus-operator, decoded strictly into the
// operator's own Go types like every other kind.
func init() {
	k8sDecoders["monitoring.coreos.com/v1/ServiceMonitor"] = strictAs[monitoringv1.ServiceMonitor]
	k8sDecoders["monitoring.coreos.com/v1/PodMonitor"] = strictAs[monitoringv1.PodMonitor]
	k8sDecoders["monitoring.coreos.com/v1/PrometheusRule"] = strictAs[monitoringv1.PrometheusRule]
	// Every deployment file has a misspelling that must fail its check
	// (TestMisspeltFieldFails); these are the component's and its overlay's.
	misspellings = append(misspellings,
		mutation{file: "k8s/components/prometheus-operator/kustomization.yaml", from: "resources:", to: "resource:"},
		mutation{file: "k8s/components/prometheus-operator/servicemonitor.yaml", from: "endpoints:", to: "endpoint:"},
		mutation{file: "k8s/components/prometheus-operator/prometheusrule.yaml", from: "    for: 2m", to: "    fore: 2m"},
		mutation{file: "k8s/overlays/prometheus-operator/kustomization.yaml", from: "components:", to: "component:"},
	)
}

// chartKubeVersion is the cluster version the chart is rendered for: the
// oldest its kubeVersion admits.
var chartKubeVersion = &chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}

// renderChart renders the chart as `helm template idem-extproc charts/idem-extproc
// --namespace idem-extproc -f valuesFile --set …` does (helmTemplate), and
// decodes every object strictly. overrides are merged over the file, as
// --set would.
func renderChart(t testing.TB, valuesFile string, overrides map[string]any) ([]k8sObject, error) {
	t.Helper()
	ch, err := loader.Load(filepath.Join(repoRoot, chartDir))
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	if valuesFile != "" {
		if vals, err = chartutil.ReadValuesFile(valuesFile); err != nil {
			t.Fatal(err)
		}
	}
	manifest, err := helmTemplate(ch, chartutil.CoalesceTables(overrides, vals), chartKubeVersion)
	if err != nil {
		return nil, err
	}
	return decodeManifests(manifest)
}

// helmTemplate renders ch with vals into one manifest as `helm template`
// does, for Kubernetes kubeVersion (nil: Helm's default capabilities). It
// takes the steps of Helm v3.22.0's client-only dry-run install, in
// pkg/action/install.go (Install.RunWithContext: dependencies, default
// capabilities, release options, values validated against the chart's
// schema) and pkg/action/action.go (Configuration.renderResources: the
// chart's kubeVersion constraint, engine.Engine's Render, NOTES.txt left
// out, releaseutil.SortManifests in install order, hooks apart, each
// manifest under "# Source:"), calling the same packages, but not
// pkg/action itself: it links Kubernetes' typed clients, which a client-only
// render never calls, and the suite compiled 330 packages for them.
func helmTemplate(ch *chart.Chart, vals map[string]any, kubeVersion *chartutil.KubeVersion) (string, error) {
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		return "", err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	if kubeVersion != nil {
		caps.KubeVersion = *kubeVersion
	}
	opts := chartutil.ReleaseOptions{Name: serverName, Namespace: serverNamespace, Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValuesWithSchemaValidation(ch, vals, opts, caps, false)
	if err != nil {
		return "", err
	}
	if c := ch.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, caps.KubeVersion.String()) {
		return "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", c, caps.KubeVersion.String())
	}
	var e engine.Engine
	files, err := e.Render(ch, top)
	if err != nil {
		return "", err
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	_, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return b.String(), nil
}

// decodeManifests decodes a multi-document manifest strictly: duplicate
// keys in the YAML, unknown fields and unknown kinds all fail.
func decodeManifests(manifest string) ([]k8sObject, error) {
	var objs []k8sObject
	var errs []error
	docs := releaseutil.SplitManifests(manifest)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		j, err := yaml.YAMLToJSONStrict([]byte(docs[k]))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		if string(j) == "null" {
			continue // a template that rendered nothing
		}
		var head struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        metav1.ObjectMeta `json:"metadata"`
		}
		if err := yaml.Unmarshal(j, &head); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		o := k8sObject{apiVersion: head.APIVersion, kind: head.Kind, namespace: head.Metadata.Namespace, name: head.Metadata.Name}
		if err := o.decode(j); err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	return objs, errors.Join(errs...)
}

// chartValuesFiles lists the chart's ci/*.yaml.
func chartValuesFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, chartDir, "ci", "*.yaml"))
	if err != nil || len(files) < 4 {
		t.Fatalf("want at least 4 values files in %s/ci, got %v (%v)", chartDir, files, err)
	}
	return files
}

// applicationObjects are objects the chart does not ship but attaches to:
// the application's routes, taken from the examples where they stand for
// yours, decoded strictly like the rest.
func applicationObjects(t testing.TB, files ...string) []k8sObject {
	t.Helper()
	var all []k8sObject
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeManifests(string(b))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, objs...)
	}
	return all
}

// TestHelmChart renders the chart with every values file and holds the
// result to the checks the kustomize builds pass (checkServerObjects,
// checkIstioObjects, checkEnvoyGatewayObjects), plus the chart's own.
func TestHelmChart(t *testing.T) {
	for _, file := range chartValuesFiles(t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			objs, err := renderChart(t, file, nil)
			if err != nil {
				t.Fatal(err)
			}
			// helm install --create-namespace makes the namespace the
			// checks expect in a build.
			objs = append(objs, k8sObject{apiVersion: "v1", kind: "Namespace", name: serverNamespace,
				obj: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: serverNamespace}}})
			var checks []error
			if filepath.Base(file) != "fixed-replicas-values.yaml" {
				checks = append(checks, checkServerObjects(objs))
			} else {
				checks = append(checks, checkFixedReplicas(objs))
			}
			checks = append(checks, checkMemoryAndSpread(objs), checkHotReload(objs), checkMonitoring(objs), checkIstioDrain(objs))
			if len(objectsOf[monitoringv1.ServiceMonitor](objs))+len(objectsOf[monitoringv1.PodMonitor](objs)) > 0 {
				t.Logf("monitors: %d ServiceMonitor, %d PodMonitor, %d PrometheusRule", len(objectsOf[monitoringv1.ServiceMonitor](objs)),
					len(objectsOf[monitoringv1.PodMonitor](objs)), len(objectsOf[monitoringv1.PrometheusRule](objs)))
			}
			withApp := objs
			switch filepath.Base(file) {
			case "istio-values.yaml":
				withApp = append(withApp, applicationObjects(t, "k8s/examples/orders-istio/gateway.yaml", "k8s/examples/orders-istio/virtualservice.yaml")...)
				if len(objectsOf[istionetv1a3.EnvoyFilter](objs)) == 0 {
					checks = append(checks, errors.New("istio values render no EnvoyFilter"))
				}
			case "envoy-gateway-values.yaml":
				withApp = append(withApp, applicationObjects(t, "k8s/examples/orders-envoy-gateway/httproutes.yaml")...)
				if len(objectsOf[egv1a1.EnvoyExtensionPolicy](objs)) == 0 {
					checks = append(checks, errors.New("envoy-gateway values render no EnvoyExtensionPolicy"))
				}
			}
			checks = append(checks, checkIstioObjects(withApp), checkEnvoyGatewayObjects(withApp))
			if err := errors.Join(checks...); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d objects", len(objs))
		})
	}
}

// TestHelmLint runs Helm's own linter (helm lint --strict) with every
// values file.
func TestHelmLint(t *testing.T) {
	for _, file := range chartValuesFiles(t) {
		vals, err := chartutil.ReadValuesFile(file)
		if err != nil {
			t.Fatal(err)
		}
		l := lint.AllWithKubeVersion(filepath.Join(repoRoot, chartDir), vals, serverNamespace, chartKubeVersion)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: %s", filepath.Base(file), m)
			}
		}
	}
}

// TestHelmChartRefusesWhatCannotWork: values that would deploy a server
// that cannot keep its promise stop the render with a message naming the
// value, as `helm install` shows it.
func TestHelmChartRefusesWhatCannotWork(t *testing.T) {
	prod := filepath.Join(repoRoot, chartDir, "ci", "production-values.yaml")
	for _, tc := range []struct {
		file      string
		overrides map[string]any
		want      string
	}{
		// No image: the chart has no registry to guess, and a default
		// would end in ImagePullBackOff rather than in this message.
		{"", nil, "image.repository is required"},
		{prod, map[string]any{"image": map[string]any{"repository": ""}}, "image.repository is required"},
		{prod, map[string]any{"redis": map[string]any{"existingSecret": ""}}, "redis.url or redis.existingSecret is required"},
		{prod, map[string]any{"encryption": map[string]any{"existingSecret": ""}}, "encryption.existingSecret or encryption.keys is required"},
		{prod, map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "512M"}}}, `resources.limits.memory "512M": write it in Mi or Gi`},
		{prod, map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "podMonitor": map[string]any{"enabled": true}}}, "not both"},
		{prod, map[string]any{"autoscaling": map[string]any{"minReplicas": 1}}, "minReplicas must be at least 2"},
		{prod, map[string]any{"image": map[string]any{"tag": "latest"}}, "pin a version"},
		{prod, map[string]any{"tls": map[string]any{"enabled": true}}, "tls.secretName is required"},
		{prod, map[string]any{"envoyGateway": map[string]any{"enabled": true, "policyNamespace": "orders"}}, "envoyGateway.targetRefs"},
		{prod, map[string]any{"istio": map[string]any{"enabled": true, "gatewayFilter": map[string]any{"enabled": true}}}, "istio.gatewayFilter.protectedRoutes"},
		{prod, map[string]any{"istio": map[string]any{"enabled": true, "gatewayFilter": map[string]any{"enabled": true,
			"protectedRoutes": []any{map[string]any{"vhost": "orders.example.com:80"}}}}}, "protectedRoutes[].name"},
	} {
		_, err := renderChart(t, tc.file, tc.overrides)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %v: got %v, want an error with %q", filepath.Base(tc.file), tc.overrides, err, tc.want)
		}
	}
}

// TestHelmChartMirrorsTheBase: with the production values the chart
// deploys what k8s/base deploys: the same server configuration, probes,
// resources, security, placement and policy file.
func TestHelmChartMirrorsTheBase(t *testing.T) {
	objs, err := renderChart(t, filepath.Join(repoRoot, chartDir, "ci", "production-values.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	base, err := buildObjects(loadK8s(t), k8sDir+"/base")
	if err != nil {
		t.Fatal(err)
	}
	chartSrv, err := findServer(objs)
	if err != nil {
		t.Fatal(err)
	}
	baseSrv, err := findServer(base)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(chartSrv.cfg, baseSrv.cfg) {
		t.Errorf("server configuration differs:\nchart %+v\nbase  %+v", chartSrv.cfg, baseSrv.cfg)
	}
	cc, bc := serverContainer(chartSrv.dep), serverContainer(baseSrv.dep)
	for name, pair := range map[string][2]any{
		"resources":       {cc.Resources, bc.Resources},
		"livenessProbe":   {cc.LivenessProbe, bc.LivenessProbe},
		"readinessProbe":  {cc.ReadinessProbe, bc.ReadinessProbe},
		"lifecycle":       {cc.Lifecycle, bc.Lifecycle},
		"securityContext": {cc.SecurityContext, bc.SecurityContext},
		"ports":           {cc.Ports, bc.Ports},
		"pod security":    {chartSrv.dep.Spec.Template.Spec.SecurityContext, baseSrv.dep.Spec.Template.Spec.SecurityContext},
		"grace period":    {chartSrv.dep.Spec.Template.Spec.TerminationGracePeriodSeconds, baseSrv.dep.Spec.Template.Spec.TerminationGracePeriodSeconds},
		"strategy":        {chartSrv.dep.Spec.Strategy, baseSrv.dep.Spec.Strategy},
		"GOMEMLIMIT":      {envValue(cc, "GOMEMLIMIT"), envValue(bc, "GOMEMLIMIT")},
	} {
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("%s differs:\nchart %+v\nbase  %+v", name, pair[0], pair[1])
		}
	}
	cPolicy := objectNamed[corev1.ConfigMap](objs, serverNamespace, serverName+"-policy")
	bPolicy, err := os.ReadFile(filepath.Join(repoRoot, k8sDir, "base", policyKey))
	if err != nil {
		t.Fatal(err)
	}
	if cPolicy == nil || !sameYAML(cPolicy.Data[policyKey], string(bPolicy)) {
		t.Errorf("the chart's default policy is not k8s/base/policy.yaml's")
	}
	// The Services and the NetworkPolicy's rules are the base's.
	for _, name := range []string{serverName, serverName + "-headless"} {
		cs, bs := objectNamed[corev1.Service](objs, serverNamespace, name), objectNamed[corev1.Service](base, serverNamespace, name)
		if cs == nil || bs == nil || !reflect.DeepEqual(cs.Spec.Ports, bs.Spec.Ports) || cs.Spec.ClusterIP != bs.Spec.ClusterIP {
			t.Errorf("Service %s differs from the base's", name)
		}
	}
	cnp, bnp := objectNamed[networkingv1.NetworkPolicy](objs, serverNamespace, serverName), objectNamed[networkingv1.NetworkPolicy](base, serverNamespace, serverName)
	if cnp == nil || bnp == nil || !reflect.DeepEqual(cnp.Spec.Ingress, bnp.Spec.Ingress) {
		t.Errorf("NetworkPolicy ingress differs from the base's")
	}
}

func envValue(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// sameYAML compares two YAML documents as data (comments and layout aside).
func sameYAML(a, b string) bool {
	var x, y any
	return yaml.Unmarshal([]byte(a), &x) == nil && yaml.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// checkFixedReplicas: without the autoscaler the Deployment sets the
// replicas (at least two) and a budget still covers them; without a
// NetworkPolicy and spread constraints there are none.
func checkFixedReplicas(objs []k8sObject) error {
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	var errs []error
	if r := srv.dep.Spec.Replicas; r == nil || *r != 3 {
		errs = append(errs, fmt.Errorf("without the autoscaler the Deployment should have the 3 replicas asked, has %v", r))
	}
	if len(objectsOf[autoscalingv2.HorizontalPodAutoscaler](objs)) != 0 || len(objectsOf[networkingv1.NetworkPolicy](objs)) != 0 {
		errs = append(errs, errors.New("autoscaler or NetworkPolicy rendered though disabled"))
	}
	if err := checkDisruptionAndScaling(objs, srv.dep); err == nil || !strings.Contains(err.Error(), "no HorizontalPodAutoscaler") || strings.Contains(err.Error(), "PodDisruptionBudget") {
		errs = append(errs, fmt.Errorf("want a budget and no autoscaler: %v", err))
	}
	return errors.Join(errs...)
}

// TestHelmChartRedisFiles: the Redis password and TLS material come from
// Secrets mounted where the flags point (the flags' parser opens these
// files, so they are checked here without it).
func TestHelmChartRedisFiles(t *testing.T) {
	objs, err := renderChart(t, filepath.Join(repoRoot, chartDir, "ci", "production-values.yaml"), map[string]any{
		"redis": map[string]any{"passwordSecret": "redis-password", "tlsSecret": "redis-tls", "tlsClientCert": true}})
	if err != nil {
		t.Fatal(err)
	}
	dep := objectNamed[appsv1.Deployment](objs, serverNamespace, serverName)
	if dep == nil {
		t.Fatal("no Deployment")
	}
	env, err := containerEnv(objs, serverNamespace, serverContainer(dep))
	if err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"redis-password-file": "/etc/idem-extproc-redis-password/password",
		"redis-ca-file":       "/etc/idem-extproc-redis-tls/ca.crt",
		"redis-cert-file":     "/etc/idem-extproc-redis-tls/tls.crt",
		"redis-key-file":      "/etc/idem-extproc-redis-tls/tls.key",
	} {
		got := env[daemon.EnvName(flag)]
		if got != want || !secretMounted(&dep.Spec.Template, got) {
			t.Errorf("--%s is %q, want %s inside a mounted Secret", flag, got, want)
		}
	}
}

// checkMemoryAndSpread: GOMEMLIMIT is about 90 % of the memory limit (at
// 100 % the kernel kills the pod before the Go runtime collects harder;
// Go's runtime/debug.SetMemoryLimit documents the variable's B/KiB/MiB/GiB
// suffixes), and every topology spread constraint honours node taints
// (nodeTaintsPolicy: Honor, so nodes the pods cannot run on are not
// counted as empty domains; k8s.io/api core/v1 TopologySpreadConstraint).
func checkMemoryAndSpread(objs []k8sObject) error {
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	c := serverContainer(srv.dep)
	var errs []error
	limit := c.Resources.Limits.Memory().Value()
	gml, err := parseGoMemLimit(envValue(c, "GOMEMLIMIT"))
	if err != nil {
		errs = append(errs, fmt.Errorf("GOMEMLIMIT: %w", err))
	} else if ratio := float64(gml) / float64(limit); ratio < 0.85 || ratio > 0.95 {
		errs = append(errs, fmt.Errorf("GOMEMLIMIT %s is %.0f%% of the %s memory limit, want about 90%%",
			envValue(c, "GOMEMLIMIT"), 100*ratio, c.Resources.Limits.Memory()))
	}
	for _, tsc := range srv.dep.Spec.Template.Spec.TopologySpreadConstraints {
		if tsc.NodeTaintsPolicy == nil || *tsc.NodeTaintsPolicy != corev1.NodeInclusionPolicyHonor {
			errs = append(errs, fmt.Errorf("topology spread on %s: nodeTaintsPolicy must be Honor", tsc.TopologyKey))
		}
	}
	return errors.Join(errs...)
}

// parseGoMemLimit reads GOMEMLIMIT as the Go runtime does: a byte count
// with an optional B, KiB, MiB, GiB or TiB suffix (runtime/debug
// SetMemoryLimit).
func parseGoMemLimit(s string) (int64, error) {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			q, err := resource.ParseQuantity(n)
			if err != nil || q.Value() <= 0 {
				return 0, fmt.Errorf("%q is not a positive byte count", s)
			}
			return q.Value() * u.mult, nil
		}
	}
	return 0, fmt.Errorf("%q has no B/KiB/MiB/GiB/TiB suffix (a resourceFieldRef would give the whole limit)", s)
}

// checkHotReload: the policy ConfigMap the pods mount keeps one name across
// changes, and nothing in the pod template changes with its content, so
// that a new policy is reloaded by the running pods (the kubelet updates
// the mount) instead of rolling them, as docs/deployment.md ("Helm")
// promises.
func checkHotReload(objs []k8sObject) error {
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	for _, v := range srv.dep.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name != serverName+"-policy" {
			return fmt.Errorf("the policy ConfigMap is %s, not the stable %s-policy", v.ConfigMap.Name, serverName)
		}
	}
	for k := range srv.dep.Spec.Template.Annotations {
		if strings.HasPrefix(k, "checksum/") {
			return fmt.Errorf("pod annotation %s rolls the pods on every policy change", k)
		}
	}
	return nil
}

// checkMonitoring: a ServiceMonitor scrapes /metrics through a Service
// port that exists and selects the server's Service; a PodMonitor a
// container port that exists; a PrometheusRule carries exactly the rules
// of observability/prometheus-rules.yaml.
func checkMonitoring(objs []k8sObject) error {
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	var errs []error
	pod := &srv.dep.Spec.Template
	for _, sm := range objectsOf[monitoringv1.ServiceMonitor](objs) {
		sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		matched := false
		for _, svc := range objectsOf[corev1.Service](objs) {
			if svc.Namespace != sm.Namespace || !sel.Matches(labels.Set(svc.Labels)) {
				continue
			}
			for _, ep := range sm.Spec.Endpoints {
				for _, p := range svc.Spec.Ports {
					if p.Name == ep.Port && ep.Path == "/metrics" && p.TargetPort.StrVal == "admin" {
						matched = true
					}
				}
			}
		}
		if !matched {
			errs = append(errs, fmt.Errorf("ServiceMonitor %s scrapes no Service port serving /metrics", sm.Name))
		}
	}
	for _, pm := range objectsOf[monitoringv1.PodMonitor](objs) {
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			errs = append(errs, fmt.Errorf("PodMonitor %s does not select the server's pods", pm.Name))
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			if ep.Port == nil || *ep.Port != "admin" || ep.Path != "/metrics" {
				errs = append(errs, fmt.Errorf("PodMonitor %s: want port admin, path /metrics", pm.Name))
			}
		}
	}
	for _, pr := range objectsOf[monitoringv1.PrometheusRule](objs) {
		if err := sameRules(pr); err != nil {
			errs = append(errs, fmt.Errorf("PrometheusRule %s: %w", pr.Name, err))
		}
	}
	return errors.Join(errs...)
}

// sameRules compares a PrometheusRule's groups with the rules file.
func sameRules(pr *monitoringv1.PrometheusRule) error {
	b, err := os.ReadFile(filepath.Join(repoRoot, "observability", "prometheus-rules.yaml"))
	if err != nil {
		return err
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(b, &want); err != nil {
		return fmt.Errorf("observability/prometheus-rules.yaml: %w", err)
	}
	if len(want.Groups) == 0 {
		return errors.New("observability/prometheus-rules.yaml has no groups")
	}
	if !reflect.DeepEqual(pr.Spec, want) {
		return errors.New("its rules differ from observability/prometheus-rules.yaml")
	}
	return nil
}

// checkIstioDrain: a server pod with an Istio sidecar keeps the sidecar
// serving while the server drains. On SIGTERM istio-agent drains Envoy and
// kills it after terminationDrainDuration, 5s when unset (istio.io/api
// mesh/v1alpha1 ProxyConfig.TerminationDrainDuration), set per pod with
// the proxy.istio.io/config annotation (istio.io/api annotation.ProxyConfig).
// With the default 5s the sidecar would cut the gateway's open ext_proc
// streams while the server still drains them.
func checkIstioDrain(objs []k8sObject) error {
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	pod := &srv.dep.Spec.Template
	if pod.Labels["sidecar.istio.io/inject"] != "true" {
		return nil
	}
	raw, ok := pod.Annotations[istioannotation.ProxyConfig.Name]
	if !ok {
		return fmt.Errorf("sidecar injected without %s: its drain would be Istio's default 5s", istioannotation.ProxyConfig.Name)
	}
	j, err := yaml.YAMLToJSONStrict([]byte(raw))
	if err != nil {
		return fmt.Errorf("%s: %w", istioannotation.ProxyConfig.Name, err)
	}
	pc := &meshv1alpha1.ProxyConfig{}
	if err := (&jsonpb.Unmarshaler{}).Unmarshal(bytes.NewReader(j), pc); err != nil {
		return fmt.Errorf("%s: %w", istioannotation.ProxyConfig.Name, err)
	}
	var preStop time.Duration
	if c := serverContainer(srv.dep); c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	drain := pc.GetTerminationDrainDuration().AsDuration()
	if drain < preStop+srv.cfg.DrainTimeout {
		return fmt.Errorf("sidecar terminationDrainDuration %v is shorter than preStop %v + --drain-timeout %v", drain, preStop, srv.cfg.DrainTimeout)
	}
	if tgp := pod.Spec.TerminationGracePeriodSeconds; tgp == nil || time.Duration(*tgp)*time.Second < drain {
		return fmt.Errorf("terminationGracePeriodSeconds %v ends the pod before the sidecar's drain %v", tgp, drain)
	}
	return nil
}

// TestHelmChartRulesFileIsTheOne: the chart carries a copy of the rules
// file (Helm reads only files inside the chart); it must be identical.
func TestHelmChartRulesFileIsTheOne(t *testing.T) {
	for _, copyPath := range []string{filepath.Join(chartDir, "files", "prometheus-rules.yaml")} {
		a, err := os.ReadFile(filepath.Join(repoRoot, "observability", "prometheus-rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, copyPath))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from observability/prometheus-rules.yaml: copy it again", copyPath)
		}
	}
}

// TestKustomizeMemoryAndSpread holds every kustomize build to the same
// GOMEMLIMIT and topology spread rules as the chart.
func TestKustomizeMemoryAndSpread(t *testing.T) {
	fsys := loadK8s(t)
	for _, dir := range kustomizations(t) {
		objs, err := buildObjects(fsys, dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkMemoryAndSpread(objs); err != nil {
			t.Errorf("%s: %v", dir, err)
		}
	}
}

// TestPrometheusOperatorComponent adds k8s/components/prometheus-operator
// to the base and to every overlay: its ServiceMonitor and PrometheusRule
// decode strictly into the operator's types, scrape the server's Service
// and carry the rules file's alerts.
func TestPrometheusOperatorComponent(t *testing.T) {
	fsys := loadK8s(t)
	for _, dir := range kustomizations(t) {
		if strings.HasSuffix(dir, "/prometheus-operator") {
			continue // it is the base with the component (TestKustomizations builds it)
		}
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tmp := k8sDir + "/with-prometheus-operator-" + filepath.Base(dir)
			rel := "../" + strings.TrimPrefix(dir, k8sDir+"/")
			k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
				"resources:\n- " + rel + "\ncomponents:\n- ../components/prometheus-operator\n"
			if err := fsys.WriteFile("/"+tmp+"/kustomization.yaml", []byte(k)); err != nil {
				t.Fatal(err)
			}
			objs, err := buildObjects(fsys, tmp)
			if err != nil {
				t.Fatal(err)
			}
			if len(objectsOf[monitoringv1.ServiceMonitor](objs)) != 1 || len(objectsOf[monitoringv1.PrometheusRule](objs)) != 1 {
				t.Fatalf("want one ServiceMonitor and one PrometheusRule in the build")
			}
			if err := errors.Join(checkServerObjects(objs), checkMonitoring(objs)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestHelmTemplateWithHelmsDefaults renders the chart as a bare
// `helm template charts/idem-extproc --set image.repository=idem-extproc`
// does: only the value the chart requires, and Helm's own default
// capabilities (chartutil.DefaultCapabilities, whose Kubernetes version is
// 1.20 unless Helm's build sets another), which a kubeVersion constraint in
// Chart.yaml would refuse. Without the image the render stops on it, not on
// anything else.
func TestHelmTemplateWithHelmsDefaults(t *testing.T) {
	ch, err := loader.Load(filepath.Join(repoRoot, chartDir))
	if err != nil {
		t.Fatal(err)
	}
	render := func(vals map[string]any) (string, error) { return helmTemplate(ch, vals, nil) }
	if _, err := render(map[string]any{}); err == nil || !strings.Contains(err.Error(), "image.repository is required") {
		t.Errorf("without values: got %v, want the image.repository message", err)
	}
	manifest, err := render(map[string]any{"image": map[string]any{"repository": "idem-extproc"}})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifests(manifest)
	if err != nil {
		t.Fatal(err)
	}
	dep := objectNamed[appsv1.Deployment](objs, serverNamespace, serverName)
	if dep == nil {
		t.Fatal("no Deployment")
	}
	if got, want := serverContainer(dep).Image, "idem-extproc:"+ch.Metadata.AppVersion; got != want {
		t.Errorf("image %q, want %q (the repository at the chart's appVersion)", got, want)
	}
}

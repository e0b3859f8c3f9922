package deploytest

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/daemon"
)

// Where the base puts the server.
const (
	serverNamespace = "idem-extproc"
	serverName      = "idem-extproc"
	policyKey       = "policy.yaml"
	// externalRedisURL stands in for a Secret the manifests expect to be
	// created outside them (production Redis, docs/deployment.md).
	externalRedisURL = "rediss://external-secret.invalid:6379/0"
)

// serverDeployment is the checked server Deployment and what was learnt
// from it.
type serverDeployment struct {
	dep *appsv1.Deployment
	cfg daemon.Config
}

// findServer returns the server Deployment and its configuration as the
// daemon would parse it.
func findServer(objs []k8sObject) (*serverDeployment, error) {
	dep := objectNamed[appsv1.Deployment](objs, serverNamespace, serverName)
	if dep == nil {
		return nil, fmt.Errorf("no Deployment %s/%s", serverNamespace, serverName)
	}
	c := serverContainer(dep)
	if c == nil {
		return nil, fmt.Errorf("Deployment %s has no container %s", serverName, serverName)
	}
	env, err := containerEnv(objs, dep.Namespace, c)
	if err != nil {
		return nil, err
	}
	flags, err := daemonFlagNames()
	if err != nil {
		return nil, err
	}
	cfg, err := parseServerConfig(flags, c.Args, env)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.Name, err)
	}
	return &serverDeployment{dep: dep, cfg: cfg}, nil
}

func serverContainer(dep *appsv1.Deployment) *corev1.Container {
	for i := range dep.Spec.Template.Spec.Containers {
		if c := &dep.Spec.Template.Spec.Containers[i]; c.Name == serverName {
			return c
		}
	}
	return nil
}

// containerEnv resolves a container's environment from the objects built
// with it, as the kubelet would. A Secret that is not in the build is one
// the operator creates (the production Redis URL): a placeholder stands in.
func containerEnv(objs []k8sObject, ns string, c *corev1.Container) (map[string]string, error) {
	env := map[string]string{}
	var errs []error
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm := objectNamed[corev1.ConfigMap](objs, ns, ef.ConfigMapRef.Name)
			if cm == nil {
				errs = append(errs, fmt.Errorf("envFrom names ConfigMap %s, which is not in the build", ef.ConfigMapRef.Name))
				continue
			}
			for k, v := range cm.Data {
				env[ef.Prefix+k] = v
			}
		default:
			errs = append(errs, fmt.Errorf("envFrom %v is not resolved by these tests", ef))
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s := objectNamed[corev1.Secret](objs, ns, ref.Name)
			switch {
			case s == nil:
				env[e.Name] = externalRedisURL
			case s.Data[ref.Key] != nil:
				env[e.Name] = string(s.Data[ref.Key])
			case s.StringData[ref.Key] != "":
				env[e.Name] = s.StringData[ref.Key]
			default:
				errs = append(errs, fmt.Errorf("env %s: Secret %s has no key %s", e.Name, ref.Name, ref.Key))
			}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := objectNamed[corev1.ConfigMap](objs, ns, ref.Name)
			if cm == nil || cm.Data[ref.Key] == "" {
				errs = append(errs, fmt.Errorf("env %s: ConfigMap %s has no key %s", e.Name, ref.Name, ref.Key))
				continue
			}
			env[e.Name] = cm.Data[ref.Key]
		case strings.HasPrefix(e.Name, daemon.EnvPrefix):
			errs = append(errs, fmt.Errorf("env %s: valueFrom %v is not resolved by these tests", e.Name, e.ValueFrom))
		}
	}
	return env, errors.Join(errs...)
}

// checkServerObjects checks the base's objects in any build: the
// Deployment's configuration, probes, security and placement, and the
// Services, budget, autoscaler, network policy and policy ConfigMap around
// it.
func checkServerObjects(objs []k8sObject) error {
	srv, err := findServer(objs)
	if err != nil {
		return err
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	dep, cfg := srv.dep, srv.cfg
	pod := &dep.Spec.Template
	c := serverContainer(dep)

	if objectNamed[corev1.Namespace](objs, "", serverNamespace) == nil {
		fail("no Namespace %s", serverNamespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
		fail("Deployment selector %v does not select its own pods", dep.Spec.Selector)
	}
	if err := checkImage(c.Image); err != nil {
		fail("%v", err)
	}
	if u, err := url.Parse(cfg.RedisURL); err != nil || u.Host == "" {
		fail("--redis-url %q: the server would run the in-memory store, one replica only", cfg.RedisURL)
	}

	// Ports and probes agree with the flags.
	grpcPort, adminPort := mustPort(cfg.Listen), mustPort(cfg.AdminListen)
	portByName := map[string]int32{}
	for _, p := range c.Ports {
		portByName[p.Name] = p.ContainerPort
	}
	if portByName["grpc"] != grpcPort || portByName["admin"] != adminPort {
		fail("container ports %v do not match --listen %s and --admin-listen %s", c.Ports, cfg.Listen, cfg.AdminListen)
	}
	checkProbe := func(kind string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			fail("%s probe: want httpGet %s on the admin port", kind, path)
			return
		}
		if p.HTTPGet.Path != path || resolvePort(p.HTTPGet.Port, portByName) != adminPort {
			fail("%s probe is %s on port %s, want %s on %d", kind, p.HTTPGet.Path, p.HTTPGet.Port.String(), path, adminPort)
		}
	}
	checkProbe("liveness", c.LivenessProbe, "/healthz")
	checkProbe("readiness", c.ReadinessProbe, "/readyz")

	// Shutdown: the grace period covers the preStop pause and the drain.
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if tgp := pod.Spec.TerminationGracePeriodSeconds; tgp == nil ||
		time.Duration(*tgp)*time.Second < preStop+cfg.DrainTimeout+5*time.Second {
		fail("terminationGracePeriodSeconds must cover preStop %v + drain %v + 5s", preStop, cfg.DrainTimeout)
	}

	// Security: non-root, read-only, nothing extra.
	psc, sc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		fail("pod securityContext.runAsNonRoot must be true")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		fail("pod securityContext.seccompProfile must be RuntimeDefault")
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		fail("container securityContext must be readOnlyRootFilesystem, no privilege escalation, drop ALL")
	}
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		fail("automountServiceAccountToken must be false: the server calls no Kubernetes API")
	}

	// Resources and placement.
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		fail("set cpu and memory requests and a memory limit")
	}
	if len(pod.Spec.TopologySpreadConstraints) == 0 {
		fail("no topologySpreadConstraints: replicas could share one node or zone")
	}
	for _, tsc := range pod.Spec.TopologySpreadConstraints {
		if s, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector); err != nil || !s.Matches(labels.Set(pod.Labels)) {
			fail("topology spread on %s does not select the server's pods", tsc.TopologyKey)
		}
	}

	// The objects around the Deployment.
	errs = append(errs, checkServices(objs, pod, grpcPort))
	errs = append(errs, checkDisruptionAndScaling(objs, dep))
	errs = append(errs, checkNetworkPolicy(objs, pod, grpcPort, adminPort))
	errs = append(errs, checkPolicyConfigMap(objs, pod, cfg))
	errs = append(errs, checkRedisInBuild(objs, cfg))
	return errors.Join(errs...)
}

func mustPort(addr string) int32 {
	p, err := portOf(addr)
	if err != nil {
		return -1
	}
	return int32(p)
}

func resolvePort(p intstr.IntOrString, byName map[string]int32) int32 {
	if p.Type == intstr.String {
		return byName[p.StrVal]
	}
	return p.IntVal
}

// checkServices: every Service in the server's namespace that selects its
// pods maps the gRPC port with appProtocol grpc, which is what makes Istio
// and Envoy Gateway speak HTTP/2 to it.
func checkServices(objs []k8sObject, pod *corev1.PodTemplateSpec, grpcPort int32) error {
	var errs []error
	found := false
	for _, o := range objs {
		svc, ok := o.obj.(*corev1.Service)
		if !ok || o.namespace != serverNamespace || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			continue
		}
		if len(svc.Spec.Selector) == 0 {
			continue
		}
		found = true
		ok = false
		for _, p := range svc.Spec.Ports {
			if p.Name != "grpc" {
				continue
			}
			ok = p.AppProtocol != nil && *p.AppProtocol == "grpc" && p.TargetPort.StrVal == "grpc"
		}
		if !ok {
			errs = append(errs, fmt.Errorf("Service %s: want a port named grpc, targetPort grpc, appProtocol grpc (container port %d)", svc.Name, grpcPort))
		}
	}
	if !found {
		errs = append(errs, errors.New("no Service selects the server's pods"))
	}
	return errors.Join(errs...)
}

func checkDisruptionAndScaling(objs []k8sObject, dep *appsv1.Deployment) error {
	var errs []error
	pdbOK := false
	for _, pdb := range objectsOf[policyv1.PodDisruptionBudget](objs) {
		s, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		pdbOK = pdbOK || (err == nil && s.Matches(labels.Set(dep.Spec.Template.Labels)))
	}
	if !pdbOK {
		errs = append(errs, errors.New("no PodDisruptionBudget covers the server's pods"))
	}
	hpaOK := false
	for _, hpa := range objectsOf[autoscalingv2.HorizontalPodAutoscaler](objs) {
		ref := hpa.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.Name != dep.Name || hpa.Namespace != dep.Namespace {
			continue
		}
		hpaOK = true
		if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 {
			errs = append(errs, errors.New("HorizontalPodAutoscaler minReplicas must be at least 2"))
		}
		if dep.Spec.Replicas != nil {
			errs = append(errs, errors.New("the Deployment sets replicas, which every apply would reset under the autoscaler"))
		}
	}
	if !hpaOK {
		errs = append(errs, errors.New("no HorizontalPodAutoscaler targets the server Deployment"))
	}
	return errors.Join(errs...)
}

// checkNetworkPolicy: a policy selects the server's pods for ingress, and
// every rule it has names its sources and opens only the two ports.
func checkNetworkPolicy(objs []k8sObject, pod *corev1.PodTemplateSpec, grpcPort, adminPort int32) error {
	var errs []error
	found := false
	for _, np := range objectsOf[networkingv1.NetworkPolicy](objs) {
		s, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if np.Namespace != serverNamespace || err != nil || !s.Matches(labels.Set(pod.Labels)) {
			continue
		}
		found = true
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			errs = append(errs, fmt.Errorf("NetworkPolicy %s does not restrict ingress", np.Name))
		}
		grpcOpen := false
		for i, r := range np.Spec.Ingress {
			if len(r.From) == 0 || len(r.Ports) == 0 {
				errs = append(errs, fmt.Errorf("NetworkPolicy %s rule %d lets any source or port in", np.Name, i))
			}
			for _, p := range r.Ports {
				if p.Port == nil || (p.Port.IntVal != grpcPort && p.Port.IntVal != adminPort) {
					errs = append(errs, fmt.Errorf("NetworkPolicy %s rule %d opens port %v", np.Name, i, p.Port))
				}
				grpcOpen = grpcOpen || (p.Port != nil && p.Port.IntVal == grpcPort)
			}
		}
		if !grpcOpen {
			errs = append(errs, fmt.Errorf("NetworkPolicy %s lets no proxy reach port %d", np.Name, grpcPort))
		}
	}
	if !found {
		errs = append(errs, errors.New("no NetworkPolicy selects the server's pods"))
	}
	return errors.Join(errs...)
}

// checkPolicyConfigMap: the ConfigMap mounted into the pod holds a policy
// file the server loads (config.Parse, as at startup), and --config points
// at it.
func checkPolicyConfigMap(objs []k8sObject, pod *corev1.PodTemplateSpec, cfg daemon.Config) error {
	var cm *corev1.ConfigMap
	var mountPath string
	for _, v := range pod.Spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		cm = objectNamed[corev1.ConfigMap](objs, serverNamespace, v.ConfigMap.Name)
		for _, c := range pod.Spec.Containers {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name {
					mountPath = m.MountPath
				}
			}
		}
	}
	if cm == nil || cm.Data[policyKey] == "" {
		return fmt.Errorf("no ConfigMap with %s is mounted into the server's pods", policyKey)
	}
	if want := path.Join(mountPath, policyKey); cfg.ConfigFile != want {
		return fmt.Errorf("--config is %q, want the mounted %s", cfg.ConfigFile, want)
	}
	set, err := config.Parse("ConfigMap "+cm.Name+" "+policyKey, []byte(cm.Data[policyKey]))
	if err != nil {
		return err
	}
	// The manifests are the production example: SECURITY.md promises that
	// they store responses sealed, so every policy encrypts, and
	// encrypting needs the key ring, from a mounted Secret.
	for _, p := range set.Policies {
		if !p.Encrypt {
			return fmt.Errorf("policy %q stores responses in the clear; the manifests ship with encrypt: true", p.Name)
		}
	}
	if cfg.EncryptionKeysFile == "" {
		return errors.New("the policies have encrypt: true but --encryption-keys-file is not set: the server would refuse to start")
	}
	if !secretMounted(pod, cfg.EncryptionKeysFile) {
		return fmt.Errorf("--encryption-keys-file %s is not inside a mounted Secret", cfg.EncryptionKeysFile)
	}
	return nil
}

// secretMounted reports whether file lies in a Secret volume's mount.
func secretMounted(pod *corev1.PodTemplateSpec, file string) bool {
	secretVols := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			secretVols[v.Name] = true
		}
	}
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if secretVols[m.Name] && strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
				return true
			}
		}
	}
	return false
}

// checkRedisInBuild: when the build brings its own Redis (the dev
// component), the server's URL points at it, and it never evicts records.
func checkRedisInBuild(objs []k8sObject, cfg daemon.Config) error {
	sts := objectNamed[appsv1.StatefulSet](objs, serverNamespace, "redis")
	if cfg.RedisURL == externalRedisURL {
		if sts != nil {
			return errors.New("a Redis StatefulSet is in the build but the server's URL Secret is not")
		}
		return nil
	}
	var errs []error
	u, err := url.Parse(cfg.RedisURL)
	if err != nil {
		return err
	}
	host := strings.Split(u.Hostname(), ".")
	svcNS := serverNamespace
	if len(host) > 1 {
		svcNS = host[1]
	}
	svc := objectNamed[corev1.Service](objs, svcNS, host[0])
	if svc == nil {
		return fmt.Errorf("--redis-url host %s is no Service in the build", u.Hostname())
	}
	portOK := false
	for _, p := range svc.Spec.Ports {
		portOK = portOK || fmt.Sprint(p.Port) == u.Port()
	}
	if !portOK {
		errs = append(errs, fmt.Errorf("--redis-url port %s is not a port of Service %s", u.Port(), svc.Name))
	}
	if sts == nil {
		return errors.Join(append(errs, errors.New("the Redis URL points into the build, but there is no Redis StatefulSet"))...)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(sts.Spec.Template.Labels)) {
		errs = append(errs, fmt.Errorf("Service %s does not select the Redis pods", svc.Name))
	}
	for _, rc := range sts.Spec.Template.Spec.Containers {
		args := strings.Join(rc.Args, " ")
		if !strings.Contains(args, "--maxmemory-policy noeviction") {
			errs = append(errs, errors.New("Redis must run with --maxmemory-policy noeviction: an evicted record re-runs its operation"))
		}
	}
	return errors.Join(errs...)
}

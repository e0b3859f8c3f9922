package deploytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	//lint:ignore SA1019 the deprecated jsonpb is the decoder Istio's own types use; see decodeIstio.
	"github.com/golang/protobuf/jsonpb"
	"google.golang.org/protobuf/runtime/protoiface"
	istionetv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetv1a3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1beta1 "sigs.k8s.io/gateway-api/apis/v1beta1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// k8sDir is where the manifests live, in the repository and in the
// in-memory copies the tests build from.
const k8sDir = "k8s"

// k8sObject is one built object, decoded into its API type.
type k8sObject struct {
	apiVersion, kind, namespace, name string
	obj                               any
}

func (o k8sObject) String() string {
	return fmt.Sprintf("%s %s/%s", o.kind, o.namespace, o.name)
}

// k8sDecoders gives every object kind the manifests may contain its Go API
// type and strict decoder. A kind missing here fails the build check.
var k8sDecoders = map[string]func(j []byte) (any, error){
	"v1/Namespace":                           strictAs[corev1.Namespace],
	"v1/ServiceAccount":                      strictAs[corev1.ServiceAccount],
	"v1/ConfigMap":                           strictAs[corev1.ConfigMap],
	"v1/Secret":                              strictAs[corev1.Secret],
	"v1/Service":                             strictAs[corev1.Service],
	"apps/v1/Deployment":                     strictAs[appsv1.Deployment],
	"apps/v1/StatefulSet":                    strictAs[appsv1.StatefulSet],
	"policy/v1/PodDisruptionBudget":          strictAs[policyv1.PodDisruptionBudget],
	"autoscaling/v2/HorizontalPodAutoscaler": strictAs[autoscalingv2.HorizontalPodAutoscaler],
	"networking.k8s.io/v1/NetworkPolicy":     strictAs[networkingv1.NetworkPolicy],
	"networking.istio.io/v1alpha3/EnvoyFilter": func(j []byte) (any, error) {
		o := &istionetv1a3.EnvoyFilter{}
		return o, decodeIstio(j, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
	},
	"networking.istio.io/v1/DestinationRule": func(j []byte) (any, error) {
		o := &istionetv1.DestinationRule{}
		return o, decodeIstio(j, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
	},
	"networking.istio.io/v1/Gateway": func(j []byte) (any, error) {
		o := &istionetv1.Gateway{}
		return o, decodeIstio(j, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
	},
	"networking.istio.io/v1/VirtualService": func(j []byte) (any, error) {
		o := &istionetv1.VirtualService{}
		return o, decodeIstio(j, &o.TypeMeta, &o.ObjectMeta, &o.Spec)
	},
	"gateway.envoyproxy.io/v1alpha1/EnvoyExtensionPolicy": strictAs[egv1a1.EnvoyExtensionPolicy],
	"gateway.envoyproxy.io/v1alpha1/ClientTrafficPolicy":  strictAs[egv1a1.ClientTrafficPolicy],
	"gateway.envoyproxy.io/v1alpha1/EnvoyProxy":           strictAs[egv1a1.EnvoyProxy],
	"gateway.envoyproxy.io/v1alpha1/BackendTrafficPolicy": strictAs[egv1a1.BackendTrafficPolicy],
	"gateway.networking.k8s.io/v1/HTTPRoute":              strictAs[gwv1.HTTPRoute],
	"gateway.networking.k8s.io/v1beta1/ReferenceGrant":    strictAs[gwv1beta1.ReferenceGrant],
}

// strictAs decodes an object into *T as the API server's strict field
// validation would: unknown, duplicate and wrongly-cased fields fail.
func strictAs[T any](j []byte) (any, error) {
	v := new(T)
	return v, strictUnmarshalJSON(j, v)
}

// decodeIstio decodes an Istio object. The client-go types' own JSON
// decoding goes through Istio's generated unmarshalers: the legacy jsonpb
// with AllowUnknownFields: true, so a misspelt spec field would pass. Here
// the envelope is decoded strictly and the spec with the same jsonpb (whose
// reading of well-known types, such as "250ms" durations, is Istio's) but
// with unknown fields refused.
func decodeIstio(j []byte, tm *metav1.TypeMeta, om *metav1.ObjectMeta, spec protoV1Message) error {
	var env struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        metav1.ObjectMeta `json:"metadata"`
		Spec            json.RawMessage   `json:"spec"`
	}
	if err := strictUnmarshalJSON(j, &env); err != nil {
		return err
	}
	*tm, *om = env.TypeMeta, env.Metadata
	if err := (&jsonpb.Unmarshaler{AllowUnknownFields: false}).Unmarshal(bytes.NewReader(env.Spec), spec); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	return nil
}

// protoV1Message is what the legacy jsonpb decodes into.
type protoV1Message = protoiface.MessageV1

// loadTree reads every file under dir of the repository into an in-memory
// file system, at the same relative paths, so that a test can change one
// file of a copy and build from it.
func loadTree(t testing.TB, dir string) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	root := filepath.Join(repoRoot, dir)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile("/"+filepath.ToSlash(rel), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

// kustomizations lists the directories with a kustomization.yaml that are
// meant to be applied: the base and every overlay (components are built
// through the overlays that use them).
func kustomizations(t testing.TB) []string {
	t.Helper()
	dirs := []string{path.Join(k8sDir, "base")}
	overlays, err := filepath.Glob(filepath.Join(repoRoot, k8sDir, "overlays", "*", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range overlays {
		dirs = append(dirs, path.Join(k8sDir, "overlays", filepath.Base(filepath.Dir(o))))
	}
	slices.Sort(dirs)
	return dirs
}

// examplesDir holds example application objects: an application's side of
// an overlay (its routes, and what puts them through the filter), applied
// on purpose after the overlay and never by it.
const examplesDir = k8sDir + "/examples"

// exampleOverlays names the overlay each example is applied after.
var exampleOverlays = map[string]string{
	"orders-istio":         "istio",
	"orders-istio-sidecar": "istio",
	"orders-envoy-gateway": "envoy-gateway",
}

// exampleBuilds lists the kustomizations withExampleBuilds writes, one per
// directory of k8s/examples; an example exampleOverlays does not place
// fails the test.
func exampleBuilds(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(repoRoot, examplesDir))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if _, ok := exampleOverlays[e.Name()]; !ok {
			t.Fatalf("%s/%s: exampleOverlays does not say which overlay it goes with", examplesDir, e.Name())
		}
		dirs = append(dirs, exampleBuild(e.Name()))
	}
	return dirs
}

// exampleBuild is the directory of the kustomization that builds example
// together with its overlay, as applying the one after the other does.
func exampleBuild(example string) string {
	return path.Join(k8sDir, "with-example-"+example)
}

// withExampleBuilds writes into fsys the kustomizations of exampleBuilds.
func withExampleBuilds(t testing.TB, fsys filesys.FileSystem) {
	t.Helper()
	for _, dir := range exampleBuilds(t) {
		example := strings.TrimPrefix(path.Base(dir), "with-example-")
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n" +
			"- ../overlays/" + exampleOverlays[example] + "\n- ../examples/" + example + "\n"
		if err := fsys.WriteFile("/"+dir+"/kustomization.yaml", []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
}

// buildObjects builds one kustomization from fsys with kustomize's own
// library and decodes every resulting object strictly.
func buildObjects(fsys filesys.FileSystem, dir string) ([]k8sObject, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(fsys, "/"+dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var objs []k8sObject
	var errs []error
	for _, r := range rm.Resources() {
		o := k8sObject{apiVersion: r.GetApiVersion(), kind: r.GetKind(), namespace: r.GetNamespace(), name: r.GetName()}
		j, err := r.MarshalJSON()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", o, err))
			continue
		}
		if err := o.decode(j); err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	return objs, errors.Join(errs...)
}

// decode sets o.obj from the object's JSON with the strict decoder of its
// apiVersion and kind: the one decoding the kustomize builds and the Helm
// renders share.
func (o *k8sObject) decode(j []byte) error {
	dec, ok := k8sDecoders[o.apiVersion+"/"+o.kind]
	if !ok {
		return fmt.Errorf("%s: no decoder for %s %s", o, o.apiVersion, o.kind)
	}
	obj, err := dec(j)
	if err != nil {
		return fmt.Errorf("%s: %w", o, err)
	}
	o.obj = obj
	return nil
}

// objectsOf returns the objects of type *T.
func objectsOf[T any](objs []k8sObject) []*T {
	var out []*T
	for _, o := range objs {
		if v, ok := o.obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// objectNamed returns the object of type *T with that namespace and name.
func objectNamed[T any](objs []k8sObject, namespace, name string) *T {
	for _, o := range objs {
		if v, ok := o.obj.(*T); ok && o.namespace == namespace && o.name == name {
			return v
		}
	}
	return nil
}

// checkKustomization builds dir from fsys, decodes every object strictly,
// and runs the checks that apply to what it contains.
func checkKustomization(fsys filesys.FileSystem, dir string) error {
	objs, err := buildObjects(fsys, dir)
	if err != nil {
		return err
	}
	var errs []error
	if err := checkServerObjects(objs); err != nil {
		errs = append(errs, err)
	}
	if err := checkIstioObjects(objs); err != nil {
		errs = append(errs, err)
	}
	if err := checkEnvoyGatewayObjects(objs); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// TestKustomizations builds the base, every overlay and every example
// (with its overlay) in-process and checks each.
func TestKustomizations(t *testing.T) {
	fsys := loadK8s(t)
	for _, dir := range append(kustomizations(t), exampleBuilds(t)...) {
		t.Run(strings.TrimPrefix(dir, k8sDir+"/"), func(t *testing.T) {
			if err := checkKustomization(fsys, dir); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// applicationKinds are an application's routing and what puts its routes
// through the filter: an overlay creates none of them (k8s/examples has an
// example application's).
var applicationKinds = []string{"Gateway", "VirtualService", "HTTPRoute", "EnvoyExtensionPolicy", "ReferenceGrant"}

// proxyWiring lists what an overlay may create outside the server's
// namespace, as kind/namespace: the proxy's own configuration, in the
// proxy's namespace.
var proxyWiring = []string{"EnvoyFilter/istio-system", "ClientTrafficPolicy/envoy-gateway-system", "EnvoyProxy/envoy-gateway-system"}

// checkOnlyTheService: a build creates the server's namespace, objects in
// it, and the proxy's wiring; no application's routing, and no EnvoyFilter
// patch that names routes (which are an application's).
func checkOnlyTheService(objs []k8sObject) error {
	var errs []error
	for _, o := range objs {
		switch {
		case slices.Contains(applicationKinds, o.kind):
			errs = append(errs, fmt.Errorf("%s is an application's: it belongs in %s, applied on purpose", o, examplesDir))
		case o.kind == "Namespace" && o.name == serverNamespace, o.namespace == serverNamespace:
		case slices.Contains(proxyWiring, o.kind+"/"+o.namespace):
		default:
			errs = append(errs, fmt.Errorf("%s is neither in the namespace %s nor the proxy's configuration", o, serverNamespace))
		}
		if ef, ok := o.obj.(*istionetv1a3.EnvoyFilter); ok {
			for i, cp := range ef.Spec.GetConfigPatches() {
				if cp.GetMatch().GetRouteConfiguration() != nil {
					errs = append(errs, fmt.Errorf("%s configPatches[%d] patches routes, which are an application's: it belongs in %s", o, i, examplesDir))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// TestOverlaysCreateOnlyTheService builds the base and every overlay and
// requires each to create the server and the proxy's wiring only, so that
// applying one creates nothing that was not asked for (and stops on no
// missing application namespace); an example's objects are applied on
// their own (exampleBuilds).
func TestOverlaysCreateOnlyTheService(t *testing.T) {
	fsys := loadK8s(t)
	for _, dir := range kustomizations(t) {
		t.Run(strings.TrimPrefix(dir, k8sDir+"/"), func(t *testing.T) {
			objs, err := buildObjects(fsys, dir)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkOnlyTheService(objs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestDevRedisComposesWithEveryOverlay proves the dev Redis component adds
// cleanly to the mesh and gateway overlays too, as the docs say.
func TestDevRedisComposesWithEveryOverlay(t *testing.T) {
	fsys := loadK8s(t)
	for _, dir := range kustomizations(t) {
		if !strings.Contains(dir, "/overlays/") || strings.HasSuffix(dir, "/dev") {
			continue
		}
		t.Run(path.Base(dir), func(t *testing.T) {
			tmp := path.Join(k8sDir, "with-dev-redis-"+path.Base(dir))
			k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
				"resources:\n- ../overlays/" + path.Base(dir) + "\ncomponents:\n- ../components/dev-redis\n"
			if err := fsys.WriteFile("/"+tmp+"/kustomization.yaml", []byte(k)); err != nil {
				t.Fatal(err)
			}
			objs, err := buildObjects(fsys, tmp)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkServerObjects(objs); err != nil {
				t.Fatal(err)
			}
			if objectNamed[appsv1.StatefulSet](objs, serverNamespace, "redis") == nil {
				t.Error("no Redis StatefulSet in the build")
			}
		})
	}
}

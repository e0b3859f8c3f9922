package deploytest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestPolicyConfigMapNameIsStable: in the base and every overlay the
// policy ConfigMap the pods mount is named without kustomize's content
// hash, so that a policy change updates it in place (a hot reload) instead
// of renaming it and rolling every pod; the env ConfigMap keeps its hash,
// since variables are read only at start.
func TestPolicyConfigMapNameIsStable(t *testing.T) {
	fsys := loadK8s(t)
	for _, dir := range kustomizations(t) {
		t.Run(strings.TrimPrefix(dir, k8sDir+"/"), func(t *testing.T) {
			objs, err := buildObjects(fsys, dir)
			if err != nil {
				t.Fatal(err)
			}
			var policy, env bool
			for _, cm := range objectsOf[corev1.ConfigMap](objs) {
				switch {
				case cm.Name == "idem-extproc-policy":
					policy = true
				case strings.HasPrefix(cm.Name, "idem-extproc-policy-"):
					t.Errorf("the policy ConfigMap is %s: a hashed name rolls the pods on every policy change", cm.Name)
				case strings.HasPrefix(cm.Name, "idem-extproc-env-"):
					env = true
				}
			}
			if !policy || !env {
				t.Fatalf("policy ConfigMap found: %v; hashed env ConfigMap found: %v", policy, env)
			}
		})
	}
}

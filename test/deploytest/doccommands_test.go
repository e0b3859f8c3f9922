package deploytest

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// deployDocs are the pages whose deployment commands a reader copies.
var deployDocs = []string{"README.md", deploymentDoc}

// codeBlock is one fenced block of a Markdown page, its logical lines joined
// (a line ending in \ continues).
type codeBlock struct {
	lang   string
	lines  []string
	text   string // as written, less the fence's indentation
	indent string
}

func codeBlocks(doc string) []codeBlock {
	var blocks []codeBlock
	var cur *codeBlock
	var line strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(l)
		if lang, ok := strings.CutPrefix(trimmed, "```"); ok {
			if cur == nil {
				cur = &codeBlock{lang: lang, indent: l[:len(l)-len(strings.TrimLeft(l, " "))]}
			} else {
				blocks = append(blocks, *cur)
				cur = nil
			}
			line.Reset()
			continue
		}
		if cur == nil {
			continue
		}
		cur.text += strings.TrimPrefix(l, cur.indent) + "\n"
		if c, ok := strings.CutSuffix(trimmed, `\`); ok {
			line.WriteString(c + " ")
			continue
		}
		line.WriteString(trimmed)
		cur.lines = append(cur.lines, line.String())
		line.Reset()
	}
	return blocks
}

// helmCommand renders the chart as one documented `helm install|upgrade|template`
// command would: its -f files, then its --set values in order, parsed by
// Helm's own strvals (as `helm --set` does). Every --set key must be one
// the chart's values.yaml has, since Helm ignores an unknown one.
func helmCommand(t *testing.T, cmd string) error {
	t.Helper()
	words := shellWords(cmd)
	i := 0
	for i < len(words) && words[i] != "helm" {
		i++
	}
	if i+1 >= len(words) || !strings.Contains(" install upgrade template ", " "+words[i+1]+" ") {
		return nil
	}
	ch, err := loader.Load(filepath.Join(repoRoot, chartDir))
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]any{}
	var pos []string
	var errs []error
	for j := i + 2; j < len(words); j++ {
		w := words[j]
		flagValue := func(name string) (string, bool) {
			if v, ok := strings.CutPrefix(w, name+"="); ok {
				return v, true
			}
			if w == name && j+1 < len(words) {
				j++
				return words[j], true
			}
			return "", false
		}
		if v, ok := flagValue("--set"); ok {
			if err := strvals.ParseInto(v, vals); err != nil {
				errs = append(errs, fmt.Errorf("--set %s: %w", v, err))
			}
			for _, kv := range strings.Split(v, ",") {
				key, _, _ := strings.Cut(kv, "=")
				if !valuesHave(ch.Values, key) {
					errs = append(errs, fmt.Errorf("--set %s: the chart's values.yaml has no %s", v, key))
				}
			}
			continue
		}
		if v, ok := flagValue("-f"); ok {
			errs = append(errs, mergeValuesFile(vals, v))
			continue
		}
		if v, ok := flagValue("--values"); ok {
			errs = append(errs, mergeValuesFile(vals, v))
			continue
		}
		if _, ok := flagValue("-n"); ok {
			continue
		}
		if _, ok := flagValue("--namespace"); ok {
			continue
		}
		switch {
		case w == "|" || w == "&&" || w == ";":
			j = len(words)
		case strings.HasPrefix(w, "-"):
		default:
			pos = append(pos, w)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if len(pos) < 2 || pos[1] != chartDir {
		return fmt.Errorf("want a release name and the chart %s, got %v", chartDir, pos)
	}
	objs, err := renderChart(t, "", vals)
	if err != nil {
		return err
	}
	dep := objectNamed[appsv1.Deployment](objs, serverNamespace, serverName)
	if dep == nil {
		return errors.New("no server Deployment")
	}
	return checkImage(serverContainer(dep).Image)
}

// valuesHave reports whether key (a --set path such as a.b or a[0].b) is
// one the chart's values have: every part down to a list, an empty map
// (a free-form value) or a leaf.
func valuesHave(vals map[string]any, key string) bool {
	var cur any = vals
	for _, part := range strings.Split(key, ".") {
		name, _, isList := strings.Cut(part, "[")
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if len(m) == 0 {
			return true
		}
		if cur, ok = m[name]; !ok {
			return false
		}
		if isList {
			_, ok := cur.([]any)
			return ok
		}
	}
	return true
}

func mergeValuesFile(vals map[string]any, file string) error {
	b, err := os.ReadFile(filepath.Join(repoRoot, file))
	if err != nil {
		return err
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	for k, x := range chartutil.CoalesceTables(vals, v) {
		vals[k] = x
	}
	return nil
}

// kustomizeCommands checks the documented kustomize commands: `kubectl
// apply -k DIR` names a kustomization of the repository, and `kustomize edit
// set image NAME=REF` (after a `cd DIR` on the same line) names the base's
// image and, written into DIR as the kustomize CLI writes it (an images:
// entry: newName, and newTag after the last ":" or digest after "@"), makes
// DIR build with exactly that image.
func kustomizeCommand(t *testing.T, cmd string) error {
	t.Helper()
	words := shellWords(cmd)
	dir := ""
	for i, w := range words {
		switch {
		case w == "cd" && i+1 < len(words):
			dir = path.Clean(words[i+1])
		case w == "-k" && i+1 < len(words) && i >= 2 && words[i-1] == "apply":
			k := path.Clean(words[i+1])
			if _, err := os.Stat(filepath.Join(repoRoot, k, "kustomization.yaml")); err != nil {
				return fmt.Errorf("kubectl apply -k %s: no kustomization there", k)
			}
		case w == "image" && i >= 3 && words[i-3] == "kustomize" && words[i-2] == "edit" && words[i-1] == "set" && i+1 < len(words):
			name, ref, ok := strings.Cut(words[i+1], "=")
			if !ok || name != baseImageName {
				return fmt.Errorf("kustomize edit set image %s: want %s=<image>", words[i+1], baseImageName)
			}
			if dir == "" {
				return fmt.Errorf("kustomize edit set image: no cd into the overlay before it")
			}
			entry := map[string]any{"name": name}
			repo, digest, hasDigest := strings.Cut(ref, "@")
			if hasDigest {
				entry["digest"] = digest
			} else if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
				repo, entry["newTag"] = repo[:i], repo[i+1:]
			}
			entry["newName"] = repo
			got, err := buildWith(t, dir, func(k map[string]any) { k["images"] = []any{entry} })
			if err != nil {
				return fmt.Errorf("kustomize edit set image %s in %s: %w", words[i+1], dir, err)
			}
			if c := serverContainer(objectNamed[appsv1.Deployment](got, serverNamespace, serverName)); c.Image != ref {
				return fmt.Errorf("kustomize edit set image %s in %s: the build runs %s", words[i+1], dir, c.Image)
			}
		}
	}
	return nil
}

// buildWith builds dir as shipped, its kustomization changed by edit.
func buildWith(t *testing.T, dir string, edit func(map[string]any)) ([]k8sObject, error) {
	t.Helper()
	fsys := loadTree(t, k8sDir)
	if err := editKustomization(fsys, dir, edit); err != nil {
		t.Fatal(err)
	}
	return buildObjects(fsys, dir)
}

// TestDocumentedDeployCommands runs, in-process, every helm and kustomize
// command of the README and docs/deployment.md that deploys: each helm
// install renders the chart with a pullable image and values the chart has,
// and each image set with kustomize builds.
func TestDocumentedDeployCommands(t *testing.T) {
	for _, doc := range deployDocs {
		helm := 0
		for _, b := range codeBlocks(string(readFile(t, filepath.Join(repoRoot, doc)))) {
			for _, l := range b.lines {
				if strings.Contains(l, "helm ") {
					if err := helmCommand(t, l); err != nil {
						t.Errorf("%s: %s\n%v", doc, l, err)
					}
					if strings.Contains(l, "helm install") {
						helm++
					}
				}
				if err := kustomizeCommand(t, l); err != nil {
					t.Errorf("%s: %s\n%v", doc, l, err)
				}
			}
		}
		if helm == 0 {
			t.Errorf("%s shows no helm install", doc)
		}
	}
}

// TestDocumentedOverlaySnippets builds each kustomization fragment of
// docs/deployment.md (a yaml block of images: or patches:) into an overlay
// as shipped: the image entry must make it build with that image, the patch
// must give the server's ServiceAccount its pull secret.
func TestDocumentedOverlaySnippets(t *testing.T) {
	const overlay = k8sDir + "/overlays/envoy-gateway"
	n := 0
	for _, b := range codeBlocks(string(readFile(t, filepath.Join(repoRoot, deploymentDoc)))) {
		var frag map[string]any
		if b.lang != "yaml" || yaml.Unmarshal([]byte(b.text), &frag) != nil {
			continue
		}
		_, images := frag["images"]
		_, patches := frag["patches"]
		if !images && !patches || len(frag) != 1 {
			continue
		}
		n++
		objs, err := buildWith(t, overlay, func(k map[string]any) {
			for key, v := range frag {
				if old, ok := k[key].([]any); ok {
					v = append(old, v.([]any)...)
				}
				k[key] = v
			}
			if !images {
				k["images"] = []any{map[string]any{"name": baseImageName, "newTag": testImageTag}}
			}
		})
		if err != nil {
			t.Errorf("%s with\n%s: %v", overlay, b.text, err)
			continue
		}
		if images {
			e := frag["images"].([]any)[0].(map[string]any)
			want := fmt.Sprintf("%v:%v", e["newName"], e["newTag"])
			got := serverContainer(objectNamed[appsv1.Deployment](objs, serverNamespace, serverName)).Image
			if got != want {
				t.Errorf("with\n%s: the image is %s, want %s", b.text, got, want)
			}
			if err := checkImage(got); err != nil {
				t.Errorf("with\n%s: %v", b.text, err)
			}
		}
		if patches {
			sa := objectNamed[corev1.ServiceAccount](objs, serverNamespace, serverName)
			if sa == nil || len(sa.ImagePullSecrets) != 1 || sa.ImagePullSecrets[0].Name != "regcred" {
				t.Errorf("with\n%s: ServiceAccount %+v, want the pull secret regcred", b.text, sa)
			}
		}
	}
	if n < 2 {
		t.Errorf("found %d kustomization snippets in %s, want the images: and patches: ones", n, deploymentDoc)
	}
}

// TestMonitoringDocNamesEveryAlert: the table of docs/deployment.md's "What
// to monitor" names exactly the alerts of observability/prometheus-rules.yaml,
// each with its severity, so that the page cannot drift from the rules.
func TestMonitoringDocNamesEveryAlert(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert  string            `json:"alert"`
				Labels map[string]string `json:"labels"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(readFile(t, filepath.Join(repoRoot, "observability", "prometheus-rules.yaml")), &rules); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			want[r.Alert] = r.Labels["severity"]
		}
	}
	_, sec, ok := strings.Cut(string(readFile(t, filepath.Join(repoRoot, deploymentDoc))), "\n### What to monitor\n")
	if !ok {
		t.Fatalf("%s has no section \"What to monitor\"", deploymentDoc)
	}
	if i := strings.Index(sec, "\n#"); i >= 0 {
		sec = sec[:i]
	}
	got := map[string]string{}
	for _, l := range strings.Split(sec, "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		if len(cells) < 2 {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		if strings.HasPrefix(name, "Idem") {
			got[name] = strings.TrimSpace(cells[1])
		}
	}
	for a, sev := range want {
		if got[a] != sev {
			t.Errorf("alert %s (severity %s): the page's table says %q", a, sev, got[a])
		}
	}
	for a := range got {
		if _, ok := want[a]; !ok {
			t.Errorf("the page's table names %s, which observability/prometheus-rules.yaml does not have", a)
		}
	}
	if len(want) == 0 {
		t.Fatal("no alerts in observability/prometheus-rules.yaml")
	}
}

package deploytest

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// deploymentDoc is the page that names every Secret and ConfigMap a user
// creates, with the command that creates it.
const deploymentDoc = "docs/deployment.md"

// objectRef is one Secret or ConfigMap a workload's pods need.
type objectRef struct {
	kind      string // Secret or ConfigMap
	namespace string
	name      string
	keys      []string // keys the pods read from it, where the pod spec tells
	by        string   // the workload and field that refer to it
}

func (r objectRef) String() string { return fmt.Sprintf("%s %s/%s", r.kind, r.namespace, r.name) }

// podTemplates returns every workload's pod template, named.
func podTemplates(objs []k8sObject) map[string]*corev1.PodTemplateSpec {
	pts := map[string]*corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			pts[o.String()] = &w.Spec.Template
		case *appsv1.StatefulSet:
			pts[o.String()] = &w.Spec.Template
		case *appsv1.DaemonSet:
			pts[o.String()] = &w.Spec.Template
		}
	}
	return pts
}

// workloadRefs lists the Secrets and ConfigMaps the pods of every workload
// need to start: volumes (projected sources included), env valueFrom,
// envFrom and imagePullSecrets. A reference marked optional is left out:
// its pods start without it. For a mounted volume, the keys are those whose
// files the containers are pointed at (an argument or variable holding a
// path inside the mount, the variables of envFrom ConfigMaps in the build
// included): a missing key is a missing file, which stops the server.
func workloadRefs(objs []k8sObject) []objectRef {
	var refs []objectRef
	for owner, pt := range podTemplates(objs) {
		ns := strings.Split(strings.Fields(owner)[1], "/")[0]
		add := func(kind, name string, optional *bool, by string, keys ...string) {
			if optional != nil && *optional {
				return
			}
			refs = append(refs, objectRef{kind: kind, namespace: ns, name: name, keys: keys, by: owner + " " + by})
		}
		// The paths the containers are pointed at.
		var paths []string
		for _, c := range slices.Concat(pt.Spec.InitContainers, pt.Spec.Containers) {
			paths = append(paths, c.Args...)
			paths = append(paths, c.Command...)
			for _, e := range c.Env {
				paths = append(paths, e.Value)
			}
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef != nil {
					if cm := objectNamed[corev1.ConfigMap](objs, ns, ef.ConfigMapRef.Name); cm != nil {
						for _, v := range cm.Data {
							paths = append(paths, v)
						}
					}
				}
			}
		}
		mountKeys := func(volume string, items []corev1.KeyToPath) []string {
			var keys []string
			for _, c := range slices.Concat(pt.Spec.InitContainers, pt.Spec.Containers) {
				for _, m := range c.VolumeMounts {
					if m.Name != volume {
						continue
					}
					for _, p := range paths {
						// An argument may be --flag=/path.
						if _, v, ok := strings.Cut(p, "="); ok && strings.HasPrefix(v, "/") {
							p = v
						}
						rel, ok := strings.CutPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")
						if !ok {
							continue
						}
						if m.SubPath != "" {
							rel = path.Join(m.SubPath, rel)
						}
						key := strings.Split(rel, "/")[0]
						for _, it := range items {
							if it.Path == rel {
								key = it.Key
							}
						}
						keys = append(keys, key)
					}
				}
			}
			slices.Sort(keys)
			return slices.Compact(keys)
		}
		for _, v := range pt.Spec.Volumes {
			switch {
			case v.Secret != nil:
				add("Secret", v.Secret.SecretName, v.Secret.Optional, "volume "+v.Name, mountKeys(v.Name, v.Secret.Items)...)
			case v.ConfigMap != nil:
				add("ConfigMap", v.ConfigMap.Name, v.ConfigMap.Optional, "volume "+v.Name, mountKeys(v.Name, v.ConfigMap.Items)...)
			case v.Projected != nil:
				for _, src := range v.Projected.Sources {
					if src.Secret != nil {
						add("Secret", src.Secret.Name, src.Secret.Optional, "projected volume "+v.Name, mountKeys(v.Name, src.Secret.Items)...)
					}
					if src.ConfigMap != nil {
						add("ConfigMap", src.ConfigMap.Name, src.ConfigMap.Optional, "projected volume "+v.Name, mountKeys(v.Name, src.ConfigMap.Items)...)
					}
				}
			}
		}
		for _, c := range slices.Concat(pt.Spec.InitContainers, pt.Spec.Containers) {
			for _, e := range c.Env {
				switch {
				case e.ValueFrom == nil:
				case e.ValueFrom.SecretKeyRef != nil:
					r := e.ValueFrom.SecretKeyRef
					add("Secret", r.Name, r.Optional, "env "+e.Name, r.Key)
				case e.ValueFrom.ConfigMapKeyRef != nil:
					r := e.ValueFrom.ConfigMapKeyRef
					add("ConfigMap", r.Name, r.Optional, "env "+e.Name, r.Key)
				}
			}
			for _, ef := range c.EnvFrom {
				if ef.SecretRef != nil {
					add("Secret", ef.SecretRef.Name, ef.SecretRef.Optional, "envFrom")
				}
				if ef.ConfigMapRef != nil {
					add("ConfigMap", ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional, "envFrom")
				}
			}
		}
		for _, s := range pt.Spec.ImagePullSecrets {
			add("Secret", s.Name, nil, "imagePullSecrets")
		}
	}
	slices.SortFunc(refs, func(a, b objectRef) int { return strings.Compare(a.by+a.String(), b.by+b.String()) })
	return refs
}

// objectKeys returns the keys of the Secret or ConfigMap r names in the
// build, and whether it is there.
func objectKeys(objs []k8sObject, r objectRef) ([]string, bool) {
	var keys []string
	switch r.kind {
	case "Secret":
		s := objectNamed[corev1.Secret](objs, r.namespace, r.name)
		if s == nil {
			return nil, false
		}
		for k := range s.Data {
			keys = append(keys, k)
		}
		for k := range s.StringData {
			keys = append(keys, k)
		}
	case "ConfigMap":
		cm := objectNamed[corev1.ConfigMap](objs, r.namespace, r.name)
		if cm == nil {
			return nil, false
		}
		for k := range cm.Data {
			keys = append(keys, k)
		}
		for k := range cm.BinaryData {
			keys = append(keys, k)
		}
	}
	return keys, true
}

// createdObject is one Secret or ConfigMap a documented command creates.
type createdObject struct {
	kind, namespace, name string
	keys                  []string // "*" for keys an env file decides
	command               string
}

// documentedObjects reads the shell commands of a Markdown page's code
// blocks (a line ending in \ continues) and returns the Secrets and
// ConfigMaps `kubectl create secret …` and `kubectl create configmap …`
// create, with the keys their flags give them (kubectl's
// --from-literal=key=value, --from-file=[key=]path, --from-env-file; a tls
// Secret's tls.crt and tls.key; a docker-registry Secret's
// .dockerconfigjson).
func documentedObjects(doc string) []createdObject {
	var out []createdObject
	var line strings.Builder
	inBlock := false
	for _, l := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "```") {
			inBlock = !inBlock
			line.Reset()
			continue
		}
		if !inBlock {
			continue
		}
		if c, ok := strings.CutSuffix(trimmed, `\`); ok {
			line.WriteString(c + " ")
			continue
		}
		line.WriteString(trimmed)
		if o, ok := parseCreate(line.String()); ok {
			out = append(out, o)
		}
		line.Reset()
	}
	return out
}

// parseCreate reads one `kubectl … create secret|configmap …` command.
func parseCreate(cmd string) (createdObject, bool) {
	words := shellWords(cmd)
	i := slices.Index(words, "kubectl")
	if i < 0 {
		return createdObject{}, false
	}
	o := createdObject{command: cmd}
	var pos []string
	for j := i + 1; j < len(words); j++ {
		w := words[j]
		switch {
		case w == "-n" || w == "--namespace":
			if j+1 < len(words) {
				o.namespace = words[j+1]
				j++
			}
		case strings.HasPrefix(w, "--namespace="):
			o.namespace = strings.TrimPrefix(w, "--namespace=")
		case strings.HasPrefix(w, "--from-literal="):
			k, _, _ := strings.Cut(strings.TrimPrefix(w, "--from-literal="), "=")
			o.keys = append(o.keys, k)
		case strings.HasPrefix(w, "--from-file="):
			src := strings.TrimPrefix(w, "--from-file=")
			if k, _, ok := strings.Cut(src, "="); ok {
				o.keys = append(o.keys, k)
			} else {
				o.keys = append(o.keys, path.Base(src))
			}
		case strings.HasPrefix(w, "--from-env-file="):
			o.keys = append(o.keys, "*")
		case strings.HasPrefix(w, "-"):
		case w == "|" || w == "&&" || w == ";":
			j = len(words)
		default:
			pos = append(pos, w)
		}
	}
	switch {
	case len(pos) >= 4 && pos[0] == "create" && pos[1] == "secret":
		o.kind, o.name = "Secret", pos[3]
		switch pos[2] {
		case "tls":
			o.keys = append(o.keys, "tls.crt", "tls.key")
		case "docker-registry":
			o.keys = append(o.keys, ".dockerconfigjson")
		}
	case len(pos) >= 3 && pos[0] == "create" && (pos[1] == "configmap" || pos[1] == "cm"):
		o.kind, o.name = "ConfigMap", pos[2]
	default:
		return createdObject{}, false
	}
	return o, true
}

// shellWords splits a command line into words as a POSIX shell would for
// these purposes: quotes group (and are removed), $( … ) stays one piece,
// a comment ends the line.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	inWord, quote, depth := false, rune(0), 0
	for i, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
				continue
			}
		case depth > 0:
			if r == ')' {
				depth--
			} else if r == '(' {
				depth++
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
			continue
		case r == '(' && i > 0 && s[i-1] == '$':
			depth++
		case r == '#' && !inWord:
			return words
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
			continue
		}
		w.WriteRune(r)
		inWord = true
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// documentedTable returns, from the page's section "The Secrets you
// create", each table row's object name (the first cell's code span) and
// the keys its second cell names.
func documentedTable(doc string) map[string][]string {
	rows := map[string][]string{}
	_, sec, ok := strings.Cut(doc, "\n### The Secrets you create\n")
	if !ok {
		return rows
	}
	if i := regexp.MustCompile(`\n##+ `).FindStringIndex(sec); i != nil {
		sec = sec[:i[0]]
	}
	code := regexp.MustCompile("`([^`]+)`")
	for _, l := range strings.Split(sec, "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		if len(cells) < 2 {
			continue
		}
		name := code.FindStringSubmatch(cells[0])
		if name == nil {
			continue
		}
		for _, k := range code.FindAllStringSubmatch(cells[1], -1) {
			rows[name[1]] = append(rows[name[1]], k[1])
		}
		if _, ok := rows[name[1]]; !ok {
			rows[name[1]] = nil
		}
	}
	return rows
}

// checkRefsCreatedOrDocumented: every Secret and ConfigMap a workload in the
// build needs is in the build, with the keys the pods read, or the page
// doc names it in its table of Secrets to create, keys included, and shows
// a command that creates it in the workload's namespace with those keys.
func checkRefsCreatedOrDocumented(objs []k8sObject, doc string) error {
	created := documentedObjects(doc)
	table := documentedTable(doc)
	var errs []error
	for _, r := range workloadRefs(objs) {
		if have, ok := objectKeys(objs, r); ok {
			for _, k := range r.keys {
				if !slices.Contains(have, k) {
					errs = append(errs, fmt.Errorf("%s needs key %q of %s, which the build creates without it", r.by, k, r))
				}
			}
			continue
		}
		keys, ok := table[r.name]
		if !ok {
			errs = append(errs, fmt.Errorf("%s needs %s, which the build does not create and %s does not name in \"The Secrets you create\"", r.by, r, deploymentDoc))
		}
		for _, k := range r.keys {
			if ok && !slices.Contains(keys, k) {
				errs = append(errs, fmt.Errorf("%s needs key %q of %s; %s's table gives it %v", r.by, k, r, deploymentDoc, keys))
			}
		}
		var cmd *createdObject
		for i, c := range created {
			if c.kind == r.kind && c.name == r.name && c.namespace == r.namespace {
				cmd = &created[i]
				break
			}
		}
		if cmd == nil {
			errs = append(errs, fmt.Errorf("%s needs %s, which the build does not create and no command in %s creates (kubectl -n %s create %s …)",
				r.by, r, deploymentDoc, r.namespace, strings.ToLower(r.kind)))
			continue
		}
		for _, k := range r.keys {
			if !slices.Contains(cmd.keys, k) && !slices.Contains(cmd.keys, "*") {
				errs = append(errs, fmt.Errorf("%s needs key %q of %s; %s creates it with %v: %s", r.by, k, r, deploymentDoc, cmd.keys, cmd.command))
			}
		}
	}
	return errors.Join(errs...)
}

// chartRefRenders are the chart renders whose references are held to the
// page: its defaults with the image it requires, every ci values file, and
// the production values with the Redis password and TLS Secrets and the
// pull secret the page names.
func chartRefRenders(t *testing.T) map[string][]k8sObject {
	t.Helper()
	image := map[string]any{"image": map[string]any{"repository": "idem-extproc", "tag": "dev"}}
	renders := map[string][]k8sObject{}
	render := func(name, file string, overrides map[string]any) {
		objs, err := renderChart(t, file, overrides)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		renders[name] = objs
	}
	render("chart defaults", "", image)
	for _, f := range chartValuesFiles(t) {
		render("chart "+filepath.Base(f), f, nil)
	}
	render("chart with the Redis password and TLS Secrets and a pull secret", filepath.Join(repoRoot, chartDir, "ci", "production-values.yaml"),
		map[string]any{
			"redis":            map[string]any{"passwordSecret": "idem-extproc-redis-password", "tlsSecret": "idem-extproc-redis-tls", "tlsClientCert": true},
			"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
		})
	return renders
}

// TestEverySecretAndConfigMapIsCreatedOrDocumented holds every overlay and
// the chart to checkRefsCreatedOrDocumented against docs/deployment.md, and
// shows the check fails once the page drops a Secret's row or command.
func TestEverySecretAndConfigMapIsCreatedOrDocumented(t *testing.T) {
	doc := string(readFile(t, filepath.Join(repoRoot, deploymentDoc)))
	renders := chartRefRenders(t)
	fsys := loadK8s(t)
	for _, dir := range kustomizations(t) {
		objs, err := buildObjects(fsys, dir)
		if err != nil {
			t.Fatal(err)
		}
		renders[dir] = objs
	}
	external := map[string]bool{}
	for name, objs := range renders {
		if err := checkRefsCreatedOrDocumented(objs, doc); err != nil {
			t.Errorf("%s:\n%v", name, err)
		}
		for _, r := range workloadRefs(objs) {
			if _, ok := objectKeys(objs, r); !ok {
				external[r.String()] = true
			}
		}
	}
	t.Logf("created by the user, as %s says: %v", deploymentDoc, slices.Sorted(func(yield func(string) bool) {
		for k := range external {
			if !yield(k) {
				return
			}
		}
	}))

	// Without the page's row or command for the key ring, the base fails.
	base := renders[path.Join(k8sDir, "base")]
	for what, cut := range map[string]*regexp.Regexp{
		"its table row": regexp.MustCompile("(?m)^\\| `idem-extproc-keys` \\|.*\n"),
		"its command":   regexp.MustCompile(`(?m)^kubectl -n idem-extproc create secret generic idem-extproc-keys[^\n]*\\\n[^\n]*\n`),
		"its key":       regexp.MustCompile(`--from-literal=keys=`),
	} {
		changed := cut.ReplaceAllString(doc, "")
		if what == "its key" {
			changed = cut.ReplaceAllString(doc, "--from-literal=ring=")
		}
		if changed == doc {
			t.Fatalf("without %s: the pattern %v matches nothing in %s", what, cut, deploymentDoc)
		}
		err := checkRefsCreatedOrDocumented(base, changed)
		if err == nil || !strings.Contains(err.Error(), "Secret idem-extproc/idem-extproc-keys") {
			t.Errorf("%s without %s: got %v, want the key ring's Secret named", deploymentDoc, what, err)
		}
	}
}

// TestShellWords: the command reader splits as the shell would.
func TestShellWords(t *testing.T) {
	got := shellWords(`kubectl -n ns create secret generic s --from-literal=keys="k1 $(head -c 32 /dev/urandom | base64)" --from-literal='a=b c' # note`)
	want := []string{"kubectl", "-n", "ns", "create", "secret", "generic", "s", "--from-literal=keys=k1 $(head -c 32 /dev/urandom | base64)", "--from-literal=a=b c"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

package deploytest

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// No registry serves the server's image, so the manifests name none: the
// base's container has the bare image name below, and the overlay a user
// applies sets where the image really is with an images: entry (kustomize
// edit set image). Each overlay refuses to build while the image has no tag,
// which the bare name never has: a replacement puts the image before the
// sentence of the Deployment's image-check annotation (a target's
// options.index below 0 prefixes, setFieldValue), and another copies the
// annotation's part after a ":" onto itself, which kustomize fails with
// "options.index 1 is out of bounds for value <annotation>" when there is
// no ":" (sigs.k8s.io/kustomize/api filters/replacement/replacement.go,
// getRefinedValue): the message names the image and the section. Within one
// kustomization kustomize runs images: before replacements:
// (api/internal/target/kusttarget_configplugin.go,
// configureBuiltinTransformers), so the check sees the overlay's own image.
const (
	// baseImageName is the image name k8s/base gives the server's container:
	// the name images: entries match.
	baseImageName = "idem-extproc"
	// noImageError is what kustomize says when the overlay applied sets
	// no image (docs/deployment.md quotes it).
	noImageError = "options.index 1 is out of bounds for value " + baseImageName +
		` is the server's image; it needs a tag, and docs/deployment.md, section "Setting the image", says how to set the one you built`
	// testImageTag is the tag the tests give the image where a kustomization
	// sets none, as a user who built and loaded idem-extproc:0.1.0 would
	// (kustomize edit set image idem-extproc:0.1.0); the name stays the
	// base's, so an overlay's own images: entry still matches it.
	testImageTag = "0.1.0"
)

// loadK8s reads k8s/ into memory as a user deploys it: with an image set
// in every kustomization that sets none (withTestImages), and each example
// buildable with its overlay (withExampleBuilds).
func loadK8s(t testing.TB) filesys.FileSystem {
	t.Helper()
	fsys := loadTree(t, k8sDir)
	withTestImages(t, fsys)
	withExampleBuilds(t, fsys)
	return fsys
}

// withTestImages gives every kustomization meant to be applied (the base and
// each overlay) that has no images: entry one for the base's image name, as
// `kustomize edit set image` would write it.
func withTestImages(t testing.TB, fsys filesys.FileSystem) {
	t.Helper()
	for _, dir := range kustomizations(t) {
		err := editKustomization(fsys, dir, func(k map[string]any) {
			if _, ok := k["images"]; !ok {
				k["images"] = []any{map[string]any{"name": baseImageName, "newTag": testImageTag}}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// editKustomization rewrites dir's kustomization.yaml in fsys through edit.
// Comments are lost, which no build reads.
func editKustomization(fsys filesys.FileSystem, dir string, edit func(map[string]any)) error {
	file := "/" + path.Join(dir, "kustomization.yaml")
	b, err := fsys.ReadFile(file)
	if err != nil {
		return err
	}
	var k map[string]any
	if err := yaml.Unmarshal(b, &k); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	edit(k)
	if b, err = yaml.Marshal(k); err != nil {
		return err
	}
	return fsys.WriteFile(file, b)
}

// checkImage refuses a server image that cannot be what the user built: none,
// one without a tag or digest (the base's bare name: the kubelet would pull
// docker.io/library/idem-extproc:latest), latest, or one on a registry host of
// the domains reserved for examples (RFC 2606 §3: example.com, .net, .org),
// which can serve nothing.
func checkImage(image string) error {
	if image == "" {
		return errors.New("the server's container has no image")
	}
	name, digest, _ := strings.Cut(image, "@")
	tag := ""
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, tag = name[:i], name[i+1:]
	}
	switch {
	case tag == "" && digest == "":
		return fmt.Errorf("image %q has no tag: set the image you built (docs/deployment.md, \"Setting the image\")", image)
	case tag == "latest":
		return fmt.Errorf("image %q is not pinned to a version", image)
	}
	if host, _, ok := strings.Cut(name, "/"); ok && strings.ContainsAny(host, ".:") {
		h := strings.Split(host, ":")[0]
		for _, d := range []string{"example.com", "example.net", "example.org"} {
			if h == d || strings.HasSuffix(h, "."+d) {
				return fmt.Errorf("image %q is on %s, a domain reserved for examples: no registry serves it", image, h)
			}
		}
	}
	return nil
}

// TestKustomizeNeedsAnImage builds every overlay as shipped: one that sets
// no image must fail with kustomize's message, one that sets its own (dev,
// for a local cluster) must render it and fail once that entry is removed,
// and every overlay given an image, even on a registry with a port (a ":"
// before the tag), must render exactly that image. The base, which the
// overlays build on and which cannot hold the check, renders the bare name,
// which the server checks refuse.
func TestKustomizeNeedsAnImage(t *testing.T) {
	const pushed = "localhost:5000/idem-extproc:0.1.0"
	for _, dir := range kustomizations(t) {
		t.Run(strings.TrimPrefix(dir, k8sDir+"/"), func(t *testing.T) {
			if dir == path.Join(k8sDir, "base") {
				objs, err := buildObjects(loadTree(t, k8sDir), dir)
				if err != nil {
					t.Fatal(err)
				}
				if err := checkServerObjects(objs); err == nil || !strings.Contains(err.Error(), "has no tag") {
					t.Fatalf("the base without an image: got %v, want its bare image refused", err)
				}
				return
			}
			var own any
			if err := editKustomization(loadTree(t, k8sDir), dir, func(k map[string]any) { own = k["images"] }); err != nil {
				t.Fatal(err)
			}
			build := func(edit func(map[string]any)) (string, error) {
				fsys := loadTree(t, k8sDir)
				if err := editKustomization(fsys, dir, edit); err != nil {
					t.Fatal(err)
				}
				objs, err := buildObjects(fsys, dir)
				if err != nil {
					return "", err
				}
				dep := objectNamed[appsv1.Deployment](objs, serverNamespace, serverName)
				if dep == nil {
					t.Fatal("no server Deployment")
				}
				return serverContainer(dep).Image, nil
			}
			unchanged := func(map[string]any) {}
			noImages := func(k map[string]any) { delete(k, "images") }
			if own != nil {
				got, err := build(unchanged)
				if err != nil {
					t.Fatalf("it sets its own image, yet: %v", err)
				}
				if err := checkImage(got); err != nil {
					t.Fatal(err)
				}
				t.Logf("its own image: %s", got)
			} else if _, err := build(unchanged); err == nil || !strings.Contains(err.Error(), noImageError) {
				t.Fatalf("it sets no image: got %v, want the build to fail with %q", err, noImageError)
			}
			if _, err := build(noImages); err == nil || !strings.Contains(err.Error(), noImageError) {
				t.Errorf("without images: got %v, want the build to fail with %q", err, noImageError)
			}
			got, err := build(func(k map[string]any) {
				k["images"] = []any{map[string]any{"name": baseImageName, "newName": "localhost:5000/idem-extproc", "newTag": "0.1.0"}}
			})
			if err != nil || got != pushed {
				t.Errorf("with images set to %s: got %q, %v", pushed, got, err)
			}
			// An image given without a tag fails too: it would pull latest.
			if _, err := build(func(k map[string]any) {
				k["images"] = []any{map[string]any{"name": baseImageName, "newName": "registry.test/idem-extproc"}}
			}); err == nil || !strings.Contains(err.Error(), "out of bounds for value registry.test/idem-extproc") {
				t.Errorf("with an image without a tag: got %v, want the build to fail", err)
			}
		})
	}
}

// TestCheckImage: what the server checks refuse, and what they let through.
func TestCheckImage(t *testing.T) {
	for image, want := range map[string]string{
		"":                            "no image",
		"idem-extproc":                "has no tag",
		"localhost:5000/idem-extproc": "has no tag",
		"idem-extproc:latest":         "not pinned",
		"registry.example.com/idem-extproc:0.1.0":   "reserved for examples",
		"docker.example.org:443/idem-extproc:0.1.0": "reserved for examples",
		"idem-extproc:dev":                          "",
		"localhost:5000/idem-extproc:0.1.0":         "",
		"ghcr.io/o/idem-extproc@sha256:0123":        "",
	} {
		err := checkImage(image)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("checkImage(%q) = %v, want %q", image, err, want)
		}
	}
}

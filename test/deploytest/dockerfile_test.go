package deploytest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
)

const (
	builderImage = "golang:1.26"
	runtimeImage = "gcr.io/distroless/static-debian12:nonroot"
	serverStage  = "idem-extproc"
)

// dockerInstructions are the Dockerfile instructions Docker knows.
var dockerInstructions = []string{"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM",
	"HEALTHCHECK", "LABEL", "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR"}

type dockerInstr struct {
	line int
	cmd  string // upper case
	args string
}

type dockerStage struct {
	image, name string
	// platform is FROM's --platform, if any.
	platform string
	instrs   []dockerInstr
}

// parseDockerfile splits a Dockerfile into stages of instructions, joining
// continued lines and dropping comments as Docker does; an unknown
// instruction is an error, as it is for docker build.
func parseDockerfile(data []byte) ([]*dockerStage, error) {
	var stages []*dockerStage
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	var cur strings.Builder
	start, n := 0, 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		full := cur.String()
		cur.Reset()
		cmd, args, _ := strings.Cut(full, " ")
		in := dockerInstr{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if !slices.Contains(dockerInstructions, in.cmd) {
			errs = append(errs, fmt.Errorf("line %d: unknown instruction %s", in.line, cmd))
			continue
		}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := &dockerStage{}
			for len(f) > 1 && strings.HasPrefix(f[0], "--") { // FROM [--platform=…] image [AS name]
				if p, ok := strings.CutPrefix(f[0], "--platform="); ok {
					st.platform = p
				}
				f = f[1:]
			}
			st.image = f[0]
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				errs = append(errs, fmt.Errorf("line %d: %s before FROM", in.line, in.cmd))
			}
			continue
		}
		st := stages[len(stages)-1]
		st.instrs = append(st.instrs, in)
	}
	if cur.Len() > 0 {
		errs = append(errs, errors.New("the file ends inside a continued line"))
	}
	return stages, errors.Join(errs...)
}

func (s *dockerStage) all(cmd string) []dockerInstr {
	var out []dockerInstr
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

var goBuildRE = regexp.MustCompile(`go build ([^&;]*?)(\./cmd/[a-z0-9-]+)`)

// checkDockerfile checks the image design: a golang:1.26 builder making
// static, trimmed binaries of commands that exist; every other stage a
// distroless non-root image running one of them by exec-form ENTRYPOINT;
// the server's stage last (the default target) exposing the daemon's
// default ports, stamped, labelled and health-checked (checkServerImage);
// the builder cross-compiling (checkMultiArch). It returns the stages by
// name.
func checkDockerfile(data []byte) (map[string]*dockerStage, error) {
	stages, err := parseDockerfile(data)
	if err != nil {
		return nil, err
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	byName := map[string]*dockerStage{}
	for i, st := range stages {
		if st.name == "" {
			fail("stage %d (FROM %s) has no name", i, st.image)
			continue
		}
		if byName[st.name] != nil {
			fail("two stages named %s", st.name)
		}
		byName[st.name] = st
	}
	if len(stages) < 2 {
		return byName, errors.Join(append(errs, errors.New("want a builder stage and at least one runtime stage"))...)
	}
	build := stages[0]
	if build.image != builderImage {
		fail("builder is FROM %s, want %s", build.image, builderImage)
	}
	cgoOff := false
	built := map[string]bool{} // output path -> built
	for _, in := range build.instrs {
		cgoOff = cgoOff || ((in.cmd == "ENV" || in.cmd == "RUN") && strings.Contains(in.args, "CGO_ENABLED=0"))
		if in.cmd != "RUN" {
			continue
		}
		for _, m := range goBuildRE.FindAllStringSubmatch(in.args, -1) {
			if !strings.Contains(m[1], "-trimpath") {
				fail("line %d: go build of %s without -trimpath", in.line, m[2])
			}
			if st, err := os.Stat(filepath.Join(repoRoot, m[2])); err != nil || !st.IsDir() {
				fail("line %d: go build of %s, which does not exist", in.line, m[2])
			}
			if out := regexp.MustCompile(`-o (\S+)`).FindStringSubmatch(m[1]); out != nil {
				built[out[1]] = true
			}
		}
	}
	if !cgoOff {
		fail("the builder does not set CGO_ENABLED=0: the binaries would need libc")
	}
	if err := checkMultiArch(build); err != nil {
		errs = append(errs, err)
	}
	for _, st := range stages[1:] {
		if st.image != runtimeImage {
			fail("stage %s is FROM %s, want %s", st.name, st.image, runtimeImage)
		}
		users := st.all("USER")
		if len(users) == 0 || !strings.HasPrefix(users[len(users)-1].args, "nonroot") {
			fail("stage %s does not end as USER nonroot", st.name)
		}
		for _, in := range st.all("COPY") {
			if from, ok := strings.CutPrefix(strings.Fields(in.args)[0], "--from="); ok {
				if byName[from] == nil || byName[from] == st {
					fail("line %d: COPY --from=%s names no earlier stage", in.line, from)
				} else if src := strings.Fields(in.args)[1]; from == build.name && !built[src] {
					fail("line %d: COPY of %s, which the builder does not build", in.line, src)
				}
			}
		}
		eps := st.all("ENTRYPOINT")
		var ep []string
		if len(eps) == 0 || json.Unmarshal([]byte(eps[len(eps)-1].args), &ep) != nil || len(ep) == 0 {
			fail("stage %s needs an exec-form ENTRYPOINT", st.name)
		}
	}
	last := stages[len(stages)-1]
	if last.name != serverStage {
		fail("the last (default) stage is %s, want %s", last.name, serverStage)
	}
	if err := checkServerPorts(last); err != nil {
		errs = append(errs, err)
	}
	if err := checkServerImage(build, last); err != nil {
		errs = append(errs, err)
	}
	return byName, errors.Join(errs...)
}

// checkMultiArch: the builder runs on the build machine's platform and
// cross-compiles for the target's, so `docker buildx build --platform
// linux/amd64,linux/arm64` needs no emulation. BUILDPLATFORM, TARGETOS and
// TARGETARCH are BuildKit's automatic platform ARGs, global ones that a
// stage must declare with ARG to use (moby/buildkit Dockerfile reference,
// "Automatic platform ARGs in the global scope").
func checkMultiArch(build *dockerStage) error {
	var errs []error
	if build.platform != "$BUILDPLATFORM" {
		errs = append(errs, fmt.Errorf("builder is FROM --platform=%q, want $BUILDPLATFORM (cross-compiling, not emulating)", build.platform))
	}
	declared := map[string]bool{}
	for _, in := range build.all("ARG") {
		for _, a := range strings.Fields(in.args) {
			name, _, _ := strings.Cut(a, "=")
			declared[name] = true
		}
	}
	for _, a := range []string{"TARGETOS", "TARGETARCH"} {
		if !declared[a] {
			errs = append(errs, fmt.Errorf("builder does not declare ARG %s: it would be empty in the stage", a))
		}
	}
	for _, in := range build.all("RUN") {
		for _, m := range goBuildRE.FindAllStringSubmatchIndex(in.args, -1) {
			// The assignments just before this go build.
			before := in.args[:m[0]]
			if i := strings.LastIndex(before, "&&"); i >= 0 {
				before = before[i:]
			}
			if !strings.Contains(before, "GOOS=$TARGETOS") || !strings.Contains(before, "GOARCH=$TARGETARCH") {
				errs = append(errs, fmt.Errorf("line %d: go build of %s without GOOS=$TARGETOS GOARCH=$TARGETARCH", in.line, in.args[m[4]:m[5]]))
			}
		}
	}
	return errors.Join(errs...)
}

// ociLabels are the OCI image annotations the server image carries
// (opencontainers/image-spec annotations.md, "Pre-Defined Annotation Keys").
var ociLabels = []string{"title", "description", "source", "licenses", "version", "revision"}

// checkServerImage: the server's binary is stamped with the VERSION build
// argument (internal/version), the image says the same version, revision,
// licence and source in OCI labels, and its HEALTHCHECK runs the binary's
// own probe (the image has no shell or curl).
func checkServerImage(build, srv *dockerStage) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	stamped := false
	for _, in := range build.all("RUN") {
		stamped = stamped || strings.Contains(in.args, "-X github.com/idem-extproc/idem-extproc/internal/version.version=${VERSION}")
	}
	if !stamped {
		fail("the server's go build does not stamp -X …/internal/version.version=${VERSION}")
	}
	labels := map[string]string{}
	for _, in := range srv.all("LABEL") {
		for _, m := range regexp.MustCompile(`(\S+?)="([^"]*)"`).FindAllStringSubmatch(in.args, -1) {
			labels[m[1]] = m[2]
		}
	}
	for _, l := range ociLabels {
		if labels["org.opencontainers.image."+l] == "" {
			fail("stage %s has no LABEL org.opencontainers.image.%s", srv.name, l)
		}
	}
	if labels["org.opencontainers.image.version"] != "${VERSION}" || labels["org.opencontainers.image.revision"] != "${REVISION}" {
		fail("the version and revision labels must be the VERSION and REVISION build arguments")
	}
	if labels["org.opencontainers.image.licenses"] != "Apache-2.0" {
		fail("licenses label %q, want Apache-2.0 (LICENSE)", labels["org.opencontainers.image.licenses"])
	}
	eps := srv.all("ENTRYPOINT")
	var ep []string
	if len(eps) > 0 {
		_ = json.Unmarshal([]byte(eps[len(eps)-1].args), &ep)
	}
	hcs := srv.all("HEALTHCHECK")
	if len(hcs) != 1 {
		fail("stage %s needs one HEALTHCHECK running the probe subcommand", srv.name)
		return errors.Join(errs...)
	}
	_, cmd, ok := strings.Cut(hcs[0].args, "CMD ")
	var argv []string
	if !ok || json.Unmarshal([]byte(cmd), &argv) != nil || len(argv) < 2 || len(ep) == 0 || argv[0] != ep[0] || argv[1] != "probe" {
		fail("line %d: HEALTHCHECK must be exec form CMD [%q, \"probe\", …], got %q", hcs[0].line, ep, hcs[0].args)
	}
	return errors.Join(errs...)
}

// imageEntrypoint is the server image's ENTRYPOINT binary.
func imageEntrypoint(stages map[string]*dockerStage) string {
	st := stages[serverStage]
	if st == nil {
		return ""
	}
	eps := st.all("ENTRYPOINT")
	var ep []string
	if len(eps) == 0 || json.Unmarshal([]byte(eps[len(eps)-1].args), &ep) != nil || len(ep) == 0 {
		return ""
	}
	return ep[0]
}

// checkServerPorts compares the server stage's EXPOSE with the ports the
// daemon listens on by default.
func checkServerPorts(st *dockerStage) error {
	cfg, err := daemon.ParseConfig(nil, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		return err
	}
	var exposed []string
	for _, in := range st.all("EXPOSE") {
		exposed = append(exposed, strings.Fields(in.args)...)
	}
	var errs []error
	for _, addr := range []string{cfg.Listen, cfg.AdminListen} {
		_, port, _ := net.SplitHostPort(addr)
		if !slices.Contains(exposed, port) {
			errs = append(errs, fmt.Errorf("stage %s does not EXPOSE %s (the daemon's default %s)", st.name, port, addr))
		}
	}
	return errors.Join(errs...)
}

func TestDockerfile(t *testing.T) {
	if _, err := checkDockerfile(readFile(t, filepath.Join(repoRoot, "Dockerfile"))); err != nil {
		t.Fatal(err)
	}
}

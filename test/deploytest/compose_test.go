package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/demoorders"
	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// composeFile is the part of the Compose specification our file uses, in
// the forms it uses them: anything else is rejected by the strict decode.
type composeFile struct {
	Name     string                     `json:"name"`
	Services map[string]*composeService `json:"services"`
}

type composeService struct {
	Image       string                       `json:"image,omitempty"`
	Build       *composeBuild                `json:"build,omitempty"`
	Command     []string                     `json:"command,omitempty"`
	Environment map[string]string            `json:"environment,omitempty"`
	Ports       []string                     `json:"ports,omitempty"`
	Volumes     []string                     `json:"volumes,omitempty"`
	DependsOn   map[string]composeDependency `json:"depends_on,omitempty"`
	Healthcheck *composeHealthcheck          `json:"healthcheck,omitempty"`
	ReadOnly    bool                         `json:"read_only,omitempty"`
}

type composeBuild struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile,omitempty"`
	Target     string `json:"target,omitempty"`
}

type composeDependency struct {
	Condition string `json:"condition"`
}

type composeHealthcheck struct {
	Test     []string `json:"test"`
	Interval string   `json:"interval,omitempty"`
	Timeout  string   `json:"timeout,omitempty"`
	Retries  int      `json:"retries,omitempty"`
}

// strictUnmarshal decodes YAML into v the way the Kubernetes API server
// decodes strictly: duplicate keys, unknown fields and fields spelt in the
// wrong case are errors.
func strictUnmarshal(data []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	return strictUnmarshalJSON(j, v)
}

func strictUnmarshalJSON(j []byte, v any) error {
	strict, err := sjson.UnmarshalStrict(j, v, sjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// daemonFlagNames lists the idem-extproc flags, read from its usage text.
func daemonFlagNames() ([]string, error) {
	var usage bytes.Buffer
	_, _ = daemon.ParseConfig([]string{"-h"}, func(string) string { return "" }, &usage)
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z-]*)`).FindAllStringSubmatch(usage.String(), -1) {
		names = append(names, m[1])
	}
	if len(names) < 5 {
		return nil, fmt.Errorf("could not read the flags from the usage text:\n%s", usage.String())
	}
	return names, nil
}

// parseServerConfig runs the daemon's own configuration parser on the
// arguments and environment a deployment gives the container. An IDEM_
// variable that names no flag is an error: the daemon would ignore it.
func parseServerConfig(flags, args []string, env map[string]string) (daemon.Config, error) {
	var errs []error
	for k := range env {
		if !strings.HasPrefix(k, daemon.EnvPrefix) {
			continue
		}
		if !slices.ContainsFunc(flags, func(f string) bool { return daemon.EnvName(f) == k }) {
			errs = append(errs, fmt.Errorf("environment variable %s names no idem-extproc flag", k))
		}
	}
	cfg, err := daemon.ParseConfig(args, func(k string) string { return env[k] }, &bytes.Buffer{})
	return cfg, errors.Join(append(errs, err)...)
}

func portOf(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// checkCompose checks docker-compose.yml: its strict form, the server's
// flags (through the daemon's own parser), the mounted Envoy configuration
// (through checkEnvoyConfig) and that every address in it is a Compose
// service on the port that service listens on.
func checkCompose(data []byte, readRepoFile func(string) ([]byte, error)) error {
	flags, err := daemonFlagNames()
	if err != nil {
		return err
	}
	var cf composeFile
	if err = strictUnmarshal(data, &cf); err != nil {
		return fmt.Errorf("docker-compose.yml: %w", err)
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, name := range []string{"envoy", "idem-extproc", "orders", "redis"} {
		if cf.Services[name] == nil {
			fail("no service %s", name)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	dockerfile, err := readRepoFile("Dockerfile")
	if err != nil {
		return err
	}
	stages, err := checkDockerfile(dockerfile)
	if err != nil {
		fail("Dockerfile: %v", err)
	}
	listens := map[string]int{"redis": 6379} // service -> port it listens on
	for name, s := range cf.Services {
		if s.Build != nil {
			if s.Build.Context != "." || (s.Build.Dockerfile != "" && s.Build.Dockerfile != "Dockerfile") {
				fail("service %s builds from %q, want the repository's Dockerfile", name, s.Build.Context)
			}
			if stages[s.Build.Target] == nil {
				fail("service %s builds target %q, which the Dockerfile lacks", name, s.Build.Target)
			}
		} else if i := strings.LastIndex(s.Image, ":"); i < 0 || s.Image[i+1:] == "latest" {
			fail("service %s: pin the image %q to a version", name, s.Image)
		}
		for dep := range s.DependsOn {
			if cf.Services[dep] == nil {
				fail("service %s depends on unknown service %s", name, dep)
			}
		}
	}

	// The server: its own parser must accept what the container gets.
	srv := cf.Services["idem-extproc"]
	// Its health check is the image's probe (no shell or curl in the
	// image), and Envoy starts once it is ready.
	if hc := srv.Healthcheck; hc == nil || len(hc.Test) < 3 || hc.Test[0] != "CMD" || hc.Test[1] != imageEntrypoint(stages) || hc.Test[2] != "probe" {
		fail("idem-extproc healthcheck must be [CMD, %s, probe, …]", imageEntrypoint(stages))
	}
	if cf.Services["envoy"].DependsOn["idem-extproc"].Condition != "service_healthy" {
		fail("envoy must depend on idem-extproc being service_healthy")
	}
	cfg, err := parseServerConfig(flags, srv.Command, srv.Environment)
	if err != nil {
		fail("idem-extproc configuration: %v", err)
	}
	if p, err := portOf(cfg.Listen); err == nil {
		listens["idem-extproc"] = p
	}
	if u, err := url.Parse(cfg.RedisURL); err != nil || u.Hostname() == "" {
		fail("idem-extproc --redis-url %q: want redis://<service>:<port>/<db>", cfg.RedisURL)
	} else if cf.Services[u.Hostname()] == nil || u.Port() != strconv.Itoa(listens["redis"]) {
		fail("idem-extproc --redis-url %q does not name the redis service on 6379", cfg.RedisURL)
	}
	if !slices.Contains(cf.Services["redis"].Command, "noeviction") {
		fail("redis must run with --maxmemory-policy noeviction: an evicted record re-runs its operation")
	}
	if p, err := portOf(demoorders.DefaultAddr); err == nil && len(cf.Services["orders"].Command) == 0 {
		listens["orders"] = p
	}

	// Envoy: the mounted configuration passes the Envoy checks, and its
	// upstream addresses are the services.
	envoy := cf.Services["envoy"]
	confPath := ""
	for i, a := range envoy.Command {
		if a == "-c" && i+1 < len(envoy.Command) {
			confPath = envoy.Command[i+1]
		}
	}
	var src string
	for _, v := range envoy.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == confPath {
			src = parts[0]
		}
	}
	if src == "" {
		return errors.Join(append(errs, fmt.Errorf("envoy: no volume mounts the -c file %q", confPath))...)
	}
	data, err = readRepoFile(filepath.Clean(src))
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("envoy config %s: %w", src, err))...)
	}
	ec, err := checkEnvoyConfig(data)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("envoy config %s: %w", src, err))...)
	}
	for _, c := range ec.bootstrap.GetStaticResources().GetClusters() {
		for _, e := range c.GetLoadAssignment().GetEndpoints() {
			for _, le := range e.GetLbEndpoints() {
				sa := le.GetEndpoint().GetAddress().GetSocketAddress()
				want, ok := listens[sa.GetAddress()]
				if !ok {
					fail("envoy cluster %s points at %s, which is no service", c.GetName(), sa.GetAddress())
				} else if int(sa.GetPortValue()) != want {
					fail("envoy cluster %s uses %s:%d, but %s listens on %d", c.GetName(), sa.GetAddress(), sa.GetPortValue(), sa.GetAddress(), want)
				}
			}
		}
	}
	for _, p := range ec.hcms {
		if mt := messageTimeout(p.extProc); cfg.StoreTimeout+messageTimeoutMargin > mt {
			fail("idem-extproc --store-timeout %v leaves less than %v under Envoy's message_timeout %v", cfg.StoreTimeout, messageTimeoutMargin, mt)
		}
	}
	published := false
	for _, l := range ec.bootstrap.GetStaticResources().GetListeners() {
		lp := strconv.Itoa(int(l.GetAddress().GetSocketAddress().GetPortValue()))
		for _, p := range envoy.Ports {
			published = published || strings.HasSuffix(p, ":"+lp)
		}
	}
	if !published {
		fail("envoy publishes none of its listener ports")
	}
	return errors.Join(errs...)
}

func TestCompose(t *testing.T) {
	read := func(p string) ([]byte, error) { return os.ReadFile(filepath.Join(repoRoot, p)) }
	if err := checkCompose(readFile(t, filepath.Join(repoRoot, "docker-compose.yml")), read); err != nil {
		t.Fatal(err)
	}
}

// TestServerBudgetDefaults ties the flag default to the constant the
// checks use, so that neither drifts alone.
func TestServerBudgetDefaults(t *testing.T) {
	cfg, err := daemon.ParseConfig(nil, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StoreTimeout != idem.DefaultStoreTimeout {
		t.Errorf("--store-timeout defaults to %v, idem.DefaultStoreTimeout is %v", cfg.StoreTimeout, idem.DefaultStoreTimeout)
	}
}

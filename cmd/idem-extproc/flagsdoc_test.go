package main

import (
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idem-extproc/idem-extproc/internal/daemon"
)

// The documentation and the binary's flags are held to each other in both
// directions, as TestMetricsAreDocumented and TestDocumentedMetricsExist
// (internal/observe) hold the metrics: the test lives where the command
// tree is built, so it reads the flags from the tree itself, every
// subcommand included, not from help text.

// flagsDoc is the page that lists every flag.
const flagsDoc = "../../docs/flags.md"

// commandFlags walks the tree newRoot builds and returns the flags of
// every command by command path. cobra's own additions (--help, and the
// help and completion commands, made only when the tree runs) are not the
// binary's to document.
func commandFlags(t *testing.T) map[string][]string {
	t.Helper()
	root := newRoot(env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard})
	out := map[string][]string{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		var names []string
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" {
				names = append(names, "--"+f.Name)
			}
		})
		if c.HasPersistentFlags() {
			t.Errorf("%s has persistent flags, which this test does not read", c.CommandPath())
		}
		out[c.CommandPath()] = names
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return out
}

// foreignFlags are the flags of other programs the documentation shows,
// with the program. A flag of idem-extproc is never listed here.
var foreignFlags = map[string]string{
	"--set": "helm", "--from-literal": "kubectl", "--from-file": "kubectl", "--dry-run": "kubectl",
	"--docker-server": "kubectl", "--docker-username": "kubectl", "--docker-password": "kubectl",
	"--build-arg": "docker build", "--platform": "docker buildx", "--push": "docker buildx", "--target": "docker build",
	"--build": "docker compose", "--dir": "redis-server", "--appendonly": "redis-server", "--maxmemory-policy": "redis-server",
	"--name": "kind", "--mode": "envoy", "--train": "zstd",
	// tools/idem-loadtest (docs/performance.md).
	"--servers": "idem-loadtest", "--reps": "idem-loadtest", "--slices": "idem-loadtest", "--scenario": "idem-loadtest",
	"--keys": "idem-loadtest", "--duplicate-rate": "idem-loadtest", "--unprotected-rate": "idem-loadtest",
	"--redis": "idem-loadtest", "--server-bin": "idem-loadtest", "--server-args": "idem-loadtest", "--profile-dir": "idem-loadtest", "--log-pipe": "idem-loadtest",
}

var (
	docFlag   = regexp.MustCompile(`(?:^|[^A-Za-z0-9_-])(--[a-z][a-z0-9-]*)`)
	docEnv    = regexp.MustCompile(`IDEM_[A-Z0-9_]*[A-Z0-9]`)
	usageEnv  = regexp.MustCompile(`env (IDEM_[A-Z0-9_]+)`)
	tableCell = regexp.MustCompile("`([^`]+)`")
)

// section returns the lines of doc's "## title" section.
func section(doc, title string) []string {
	_, rest, ok := strings.Cut(doc, "\n## "+title+"\n")
	if !ok {
		return nil
	}
	rest, _, _ = strings.Cut(rest, "\n## ")
	return strings.Split(rest, "\n")
}

// tableRows returns the rows of a section's table as cells, header and
// rule left out.
func tableRows(lines []string) [][]string {
	var rows [][]string
	for _, l := range lines {
		if !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| ---") {
			continue
		}
		var cells []string
		for c := range strings.SplitSeq(strings.ReplaceAll(strings.Trim(l, "| "), `\|`, "\x00"), "|") {
			cells = append(cells, strings.ReplaceAll(strings.TrimSpace(c), "\x00", "|"))
		}
		rows = append(rows, cells)
	}
	if len(rows) > 0 {
		rows = rows[1:] // the header
	}
	return rows
}

// codeSpans returns the `code` spans of a table cell.
func codeSpans(cell string) []string {
	var out []string
	for _, m := range tableCell.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestFlagsAreDocumented: every flag of every command has its row in
// docs/flags.md: the server's (idem-extproc and serve) in "Server flags"
// with its environment variable, every other command's in "Command flags".
func TestFlagsAreDocumented(t *testing.T) {
	b, err := os.ReadFile(flagsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	server := map[string]bool{}
	for _, row := range tableRows(section(doc, "Server flags")) {
		flags, envs := codeSpans(row[0]), codeSpans(row[1])
		if len(flags) != len(envs) {
			t.Errorf("docs/flags.md server flags row %v: %d flags, %d environment variables", flags, len(flags), len(envs))
			continue
		}
		for i, f := range flags {
			server[f] = true
			if want := daemon.EnvName(strings.TrimPrefix(f, "--")); envs[i] != want {
				t.Errorf("docs/flags.md gives %s the environment variable %s; the server reads %s", f, envs[i], want)
			}
		}
	}
	commands := map[string][]string{}
	commandEnvs := map[string][]string{} // "command --flag" -> the variables its row names
	for _, row := range tableRows(section(doc, "Command flags")) {
		if len(row) < 3 {
			t.Errorf("docs/flags.md command flags row %v: want command, flag and env cells", row)
			continue
		}
		cmds := codeSpans(row[0])
		for _, f := range codeSpans(row[1]) {
			for _, c := range cmds {
				commands[c] = append(commands[c], f)
				commandEnvs[c+" "+f] = codeSpans(row[2])
			}
		}
	}
	have := commandFlags(t)
	root := newRoot(env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard})
	for path, flags := range have {
		isServer := path == "idem-extproc" || path == "idem-extproc serve"
		for _, f := range flags {
			switch {
			case isServer && (server[f] || slices.Contains(commands[path], f)):
			case !isServer && slices.Contains(commands[path], f):
			default:
				t.Errorf("%s %s has no row in docs/flags.md", path, f)
			}
		}
		if isServer {
			continue
		}
		for _, fl := range flagsOf(root, strings.Fields(path)[1:]...) {
			var want []string
			for _, m := range usageEnv.FindAllStringSubmatch(fl.Usage, -1) {
				want = append(want, m[1])
			}
			if got := commandEnvs[path+" --"+fl.Name]; fl.Name != "help" && !slices.Equal(got, want) {
				t.Errorf("docs/flags.md gives %s --%s the environment variables %v; it reads %v", path, fl.Name, got, want)
			}
		}
	}
	for path, flags := range commands {
		for _, f := range flags {
			if !slices.Contains(have[path], f) {
				t.Errorf("docs/flags.md lists %s %s, which the binary does not have", path, f)
			}
		}
	}
	for f := range server {
		if !slices.Contains(have["idem-extproc serve"], f) {
			t.Errorf("docs/flags.md lists the server flag %s, which the binary does not have", f)
		}
	}
}

// TestDocumentedFlagsExist is the other half: every --flag and IDEM_
// variable named in docs/*.md and README.md is one the binary has (a name
// ending in "-" is a family: some flag must start with it), unless it is
// another program's (foreignFlags).
func TestDocumentedFlagsExist(t *testing.T) {
	flags, envs := map[string]bool{"--help": true}, map[string]bool{}
	for _, fs := range commandFlags(t) {
		for _, f := range fs {
			flags[f] = true
		}
	}
	root := newRoot(env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard})
	for _, f := range flagsOf(root, "serve") {
		envs[daemon.EnvName(f.Name)] = true
	}
	for _, c := range []string{"get", "purge", "resolve", "adoption"} {
		for _, f := range flagsOf(root, "admin", c) {
			for _, m := range usageEnv.FindAllStringSubmatch(f.Usage, -1) {
				envs[m[1]] = true
			}
		}
	}
	for f := range foreignFlags {
		if flags[f] {
			t.Errorf("foreignFlags lists %s (%s), which idem-extproc has too: drop it from the list", f, foreignFlags[f])
		}
	}
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, file := range append(files, "../../README.md") {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range docFlag.FindAllStringSubmatch(string(b), -1) {
			seen++
			f := m[1]
			family, isFamily := strings.CutSuffix(f, "-")
			switch {
			case foreignFlags[f] != "", flags[f]:
			case isFamily && slices.ContainsFunc(slices.Collect(maps.Keys(flags)), func(n string) bool { return strings.HasPrefix(n, family+"-") }):
			default:
				t.Errorf("%s names %s, which no command of idem-extproc has", filepath.Base(file), f)
			}
		}
		for _, e := range docEnv.FindAllString(string(b), -1) {
			if !envs[e] {
				t.Errorf("%s names %s, which idem-extproc does not read", filepath.Base(file), e)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no flag named in the docs: the pattern is wrong")
	}
}

// flagsOf returns the flags of the command at path under root.
func flagsOf(root *cobra.Command, path ...string) []*pflag.Flag {
	c, _, err := root.Find(path)
	if err != nil {
		return nil
	}
	var out []*pflag.Flag
	c.Flags().VisitAll(func(f *pflag.Flag) { out = append(out, f) })
	return out
}

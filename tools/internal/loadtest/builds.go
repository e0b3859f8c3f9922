package loadtest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The Redis deployments the tool can start (--redis).
const (
	topologyStandalone = "standalone"
	topologyCluster    = "cluster"
)

// build is one idem-extproc binary measured: its label in the report and
// its path ("" for this tool's own serve-idem).
type build struct {
	label, bin string
}

// buildList is the --server-bin flag: one path, or label=path entries,
// comma-separated or the flag repeated.
type buildList []string

func (b *buildList) String() string { return strings.Join(*b, ",") }

func (b *buildList) Set(v string) error {
	*b = append(*b, v)
	return nil
}

// builds parses the flag's entries. No entry is this tool's own daemon
// code, named idem-extproc; one bare path is idem-extproc too; several
// need a label each, unique, and none may be another server's name.
func (b buildList) builds() ([]build, error) {
	var entries []string
	for _, v := range b {
		entries = append(entries, splitList(v)...)
	}
	if len(entries) == 0 {
		return []build{{label: serverIdem}}, nil
	}
	var out []build
	var errs []error
	for _, e := range entries {
		label, bin, ok := strings.Cut(e, "=")
		if !ok {
			label, bin = serverIdem, e
		}
		label, bin = strings.TrimSpace(label), strings.TrimSpace(bin)
		switch {
		case !ok && len(entries) > 1:
			errs = append(errs, fmt.Errorf("--server-bin: %q: name each of several binaries as label=path", e))
		case label == "" || bin == "":
			errs = append(errs, fmt.Errorf("--server-bin: %q: want label=path", e))
		case isReference(label) || strings.ContainsAny(label, " \t/"):
			errs = append(errs, fmt.Errorf("--server-bin: label %q: not noop, floor, minimal or lean, no spaces or slashes", label))
		case slices.ContainsFunc(out, func(o build) bool { return o.label == label }):
			errs = append(errs, fmt.Errorf("--server-bin: label %q twice", label))
		}
		out = append(out, build{label: label, bin: bin})
	}
	return out, errors.Join(errs...)
}

// expandServers returns the measured servers' names in the order of
// --servers, idem-extproc standing for every build in its place, and
// what kind of server each name is.
func expandServers(servers []string, builds []build) ([]string, map[string]string) {
	var names []string
	kinds := map[string]string{}
	for _, s := range servers {
		if s != serverIdem {
			names = append(names, s)
			kinds[s] = s
			continue
		}
		for _, b := range builds {
			names = append(names, b.label)
			kinds[b.label] = serverIdem
		}
	}
	return names, kinds
}

// parseCounts parses a comma-separated list of positive integers, in its
// order, without repeats.
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("name at least one")
	}
	return out, nil
}

// idemServers are cfg's idem-extproc servers, in order: the first is the
// base the others are compared with.
func (cfg *config) idemServers() []string {
	var out []string
	for _, s := range cfg.servers {
		if cfg.kinds[s] == serverIdem {
			out = append(out, s)
		}
	}
	return out
}

// binOf returns the binary of the idem-extproc build named label.
func (cfg *config) binOf(label string) string {
	for _, b := range cfg.builds {
		if b.label == label {
			return b.bin
		}
	}
	return ""
}

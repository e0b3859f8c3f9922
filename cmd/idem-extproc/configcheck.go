package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

func configCommand(e env) *cobra.Command {
	cmd := groupCommand("config", "Work with policy configuration files offline", e)
	cmd.AddCommand(&cobra.Command{
		Use:   "check FILE",
		Short: "Validate a policy file as the server would and print the effective policies",
		Long: "Validate a policy file exactly as the server does at start and on reload, without a server or a\n" +
			"store, and print the effective policies in match order: every setting filled in from defaults:\n" +
			"and the built-in defaults, each policy's response rules followed by the built-in ones.\n" +
			"Exit code 0: valid; 1: invalid (one line per mistake, naming the file, line and field on stderr).",
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			set, err := config.Load(args[0])
			if err != nil {
				fmt.Fprintf(e.stderr, "%v\n", err)
				return exitFailure
			}
			out, err := yaml.Marshal(effective(set))
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "# %s is valid. Effective policies, in match order (the first match applies):\n", args[0])
			_, err = e.stdout.Write(out)
			for _, p := range set.Policies {
				if p.Encrypt {
					fmt.Fprintf(e.stderr, "note: policy %q has encrypt: true: the server needs --encryption-keys-file\n", p.Name)
				}
			}
			if !hasDefault(set) {
				fmt.Fprintln(e.stderr, "note: default_policy is disabled: requests no listed policy matches are not protected")
			}
			return err
		},
	})
	return cmd
}

func hasDefault(set *policy.Set) bool {
	for _, p := range set.Policies {
		if p.Name == policy.DefaultPolicyName {
			return true
		}
	}
	return false
}

// The types below print a policy.Set in the configuration file's own
// vocabulary (README "Configuration"), every field present.
type (
	effectiveDoc struct {
		Policies []effectivePolicy `yaml:"policies"`
	}
	effectivePolicy struct {
		Name               string          `yaml:"name"`
		Match              effectiveMatch  `yaml:"match"`
		Enforcement        string          `yaml:"enforcement"`
		ShadowHeader       string          `yaml:"shadow_header,omitempty"`
		AdoptShadowRecords bool            `yaml:"adopt_shadow_records"`
		Key                effectiveKey    `yaml:"key"`
		Scope              effectiveScope  `yaml:"scope"`
		Retention          string          `yaml:"retention"`
		Lease              string          `yaml:"lease"`
		RetryAfter         string          `yaml:"retry_after"`
		MaxRequestBody     string          `yaml:"max_request_body"`
		MaxStoredBody      string          `yaml:"max_stored_body"`
		StoreFailure       string          `yaml:"store_failure"`
		Fingerprint        effectiveFP     `yaml:"fingerprint"`
		Responses          []effectiveRule `yaml:"responses"`
		OnStreamReset      string          `yaml:"on_stream_reset"`
		OnLeaseExpiry      string          `yaml:"on_lease_expiry"`
		StoredHeadersDeny  []string        `yaml:"stored_headers_deny,flow"`
		Encrypt            bool            `yaml:"encrypt"`
		Durability         string          `yaml:"durability"`
		DurabilityReplicas int             `yaml:"durability_replicas,omitempty"`
		DurabilityTimeout  string          `yaml:"durability_timeout,omitempty"`
		WaitForInFlight    string          `yaml:"wait_for_in_flight"`
	}
	effectiveMatch struct {
		RouteNames []string `yaml:"route_names,omitempty,flow"`
		Hosts      []string `yaml:"hosts,omitempty,flow"`
		Methods    []string `yaml:"methods,omitempty,flow"`
		PathExact  string   `yaml:"path_exact,omitempty"`
		PathPrefix string   `yaml:"path_prefix,omitempty"`
		PathRegex  string   `yaml:"path_regex,omitempty"`
	}
	effectiveKey struct {
		Header    string `yaml:"header"`
		Required  bool   `yaml:"required"`
		MaxLength int    `yaml:"max_length"`
		WarnUntil string `yaml:"warn_until,omitempty"`
	}
	effectiveScope struct {
		From              string   `yaml:"from"`
		Header            string   `yaml:"header,omitempty"`
		MetadataNamespace string   `yaml:"metadata_namespace,omitempty"`
		MetadataPath      []string `yaml:"metadata_path,omitempty,flow"`
	}
	effectiveFP struct {
		Headers []string `yaml:"headers,flow"`
		JSON    bool     `yaml:"json"`
	}
	effectiveRule struct {
		Status string `yaml:"status"`
		Origin string `yaml:"origin"`
		Action string `yaml:"action"`
	}
)

func effective(set *policy.Set) effectiveDoc {
	doc := effectiveDoc{Policies: []effectivePolicy{}}
	for _, p := range set.Policies {
		ep := effectivePolicy{
			Name: p.Name,
			Match: effectiveMatch{RouteNames: p.Match.RouteNames, Hosts: p.Match.Hosts, Methods: p.Match.Methods,
				PathExact: p.Match.PathExact, PathPrefix: p.Match.PathPrefix},
			Enforcement:        p.Enforcement.String(),
			ShadowHeader:       p.ShadowHeader,
			AdoptShadowRecords: p.AdoptShadowRecords,
			Key:                effectiveKey{Header: p.KeyHeader, Required: p.KeyRequired, MaxLength: p.MaxKeyLength},
			Scope:              effectiveScope{From: scopeName(p.Scope.Source), Header: p.Scope.Header, MetadataNamespace: p.Scope.Namespace, MetadataPath: p.Scope.Path},
			Retention:          durationName(p.Retention),
			Lease:              durationName(p.Lease),
			RetryAfter:         durationName(p.RetryAfter),
			MaxRequestBody:     sizeName(p.MaxRequestBody),
			MaxStoredBody:      sizeName(p.MaxStoredBody),
			StoreFailure:       map[policy.FailureMode]string{policy.FailClosed: "fail_closed", policy.FailOpen: "fail_open"}[p.FailureMode],
			Fingerprint:        effectiveFP{Headers: p.FingerprintHeaders, JSON: p.FingerprintJSON},
			OnStreamReset:      p.OnStreamReset.String(),
			OnLeaseExpiry:      map[idem.LeaseExpiry]string{idem.LeaseExpiryUnknown: "unknown", idem.LeaseExpiryReexecute: "reexecute"}[p.LeaseExpiry],
			StoredHeadersDeny:  append([]string{}, p.StoredHeaderDeny...),
			Encrypt:            p.Encrypt,
			Durability:         p.Durability.String(),
			WaitForInFlight:    durationName(p.WaitForInFlight),
		}
		if p.Match.PathRegex != nil {
			ep.Match.PathRegex = p.Match.PathRegex.String()
		}
		if !p.KeyWarnUntil.IsZero() {
			ep.Key.WarnUntil = p.KeyWarnUntil.UTC().Format(time.RFC3339)
		}
		if p.Durability == policy.DurabilityReplicated {
			ep.DurabilityReplicas = p.DurabilityReplicas
			ep.DurabilityTimeout = durationName(p.DurabilityTimeout)
		}
		for _, r := range p.ResponseRules {
			ep.Responses = append(ep.Responses, effectiveRule{Status: statusName(r.MinStatus, r.MaxStatus),
				Origin: originName(r.Origin), Action: r.Action.String()})
		}
		doc.Policies = append(doc.Policies, ep)
	}
	return doc
}

func scopeName(s policy.ScopeSource) string {
	switch s {
	case policy.ScopeAuthority:
		return "authority"
	case policy.ScopeNone:
		return "none"
	case policy.ScopeHeader:
		return "header"
	case policy.ScopeMetadata:
		return "metadata"
	case policy.ScopePrincipal:
		return "principal"
	}
	return "invalid"
}

// originName uses the configuration's names for an origin.
func originName(o idem.Origin) string {
	switch o {
	case idem.OriginUpstream:
		return "upstream"
	case idem.OriginNotSent:
		return "envoy_not_sent"
	case idem.OriginMaybeSent:
		return "envoy_maybe_sent"
	}
	return "invalid"
}

func statusName(lo, hi int) string {
	switch {
	case lo == hi:
		return strconv.Itoa(lo)
	case lo == 0 && hi == 999:
		return "any"
	case lo%100 == 0 && hi == lo+99:
		return strconv.Itoa(lo/100) + "xx"
	}
	return fmt.Sprintf("%d-%d", lo, hi)
}

// sizeName writes a byte count in the largest unit that divides it.
func sizeName(n int) string {
	for _, u := range []struct {
		name string
		size int
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.Itoa(n/u.size) + u.name
		}
	}
	return strconv.Itoa(n)
}

// durationName writes d as the configuration would, without the zero
// units time.Duration.String adds ("72h", not "72h0m0s").
func durationName(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

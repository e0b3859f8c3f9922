package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-extproc/idem-extproc/internal/config"
	"github.com/idem-extproc/idem-extproc/internal/daemon"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/region"
)

func configCommand(e env) *cobra.Command {
	cmd := groupCommand("config", "Work with policy configuration files offline", e)
	var (
		sizeAt                    []string
		storeTimeout, envoyMaxMsg time.Duration
	)
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a policy file as the server would and print the effective policies",
		Long: "Validate a policy file exactly as the server does at start and on reload, without a server or a\n" +
			"store, and print the effective policies in match order as a policy file: every setting in force\n" +
			"written out in each policy (from the policy, defaults: or the built-in defaults), in the file's own\n" +
			"keys, so that the printout loads as the same policies. Each policy's responses are its own rules:\n" +
			"the built-in ones always follow them.\n" +
			"With --size-at, it prints instead the Redis memory the policies need at that rate of protected\n" +
			"first writes, kept for each policy's retention, from the bytes per record measured on generated\n" +
			"answers (docs/performance.md, \"Memory per stored answer\").\n" +
			"Exit code 0: valid; 1: invalid (one line per mistake, naming the file, line and field on stderr).",
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			set, err := config.Load(args[0])
			if err != nil {
				fmt.Fprintf(e.stderr, "%v\n", err)
				return exitFailure
			}
			if len(sizeAt) > 0 {
				rates, err := parseRates(sizeAt, set)
				if err != nil {
					fmt.Fprintf(e.stderr, "--size-at: %v\n", err)
					return exitFailure
				}
				printSizing(e.stdout, set, rates)
				return nil
			}
			out, err := config.Marshal(set)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "# %s is valid. Effective policies, in match order (the first match applies).\n"+
				"# Every setting in force is written out; the built-in response rules follow each policy's own\n"+
				"# (docs/design.md §4). This output loads as the same policies.\n", args[0])
			_, err = e.stdout.Write(out)
			for _, p := range set.Policies {
				if p.Encrypt {
					fmt.Fprintf(e.stderr, "note: policy %q has encrypt: true: the server needs --encryption-keys-file\n", p.Name)
				}
			}
			if set.Homes != nil {
				noteReach(e.stderr, set.Homes, storeTimeout, envoyMaxMsg)
			}
			if !hasDefault(set) {
				fmt.Fprintln(e.stderr, "note: default_policy is disabled: requests no listed policy matches are not protected")
			}
			return err
		},
	}
	check.Flags().StringArrayVar(&sizeAt, "size-at", nil,
		"print the Redis memory needed at RATE protected first writes per second (`RATE` for every policy, "+
			"or POLICY=RATE, repeated)")
	check.Flags().DurationVar(&storeTimeout, "store-timeout", idem.DefaultStoreTimeout,
		"the servers' --store-timeout, for the reach of a homes map")
	check.Flags().DurationVar(&envoyMaxMsg, "envoy-max-message-timeout", daemon.DefaultEnvoyMaxMessageTimeout,
		"the servers' --envoy-max-message-timeout, for the reach of a homes map")
	cmd.AddCommand(check)
	return cmd
}

// noteReach says how far from a scope's home a server may be before it
// refuses the scope's keys (idempotency-home-out-of-reach): the largest
// round trip at which a first reservation's calls fit in what Envoy grants
// one message, for a home elsewhere and for each move.
func noteReach(w io.Writer, h *policy.Homes, storeTimeout, envoyMaxMsg time.Duration) {
	fmt.Fprintf(w, "note: homes: with --store-timeout %v and --envoy-max-message-timeout %v, a server more than %v "+
		"(round trip) from a scope's home refuses its keys (idempotency-home-out-of-reach, docs/regions.md)\n",
		storeTimeout, envoyMaxMsg, region.MaxRTT(1, storeTimeout, envoyMaxMsg))
	for _, r := range h.Rules {
		if r.MovedFrom != "" {
			fmt.Fprintf(w, "note: homes: while %s move from %s to %s, a server more than %v from both (neither its own region) refuses their keys\n",
				strings.Join(r.Scopes, ", "), r.MovedFrom, r.Region, region.MaxRTT(2, storeTimeout, envoyMaxMsg))
		}
	}
}

func hasDefault(set *policy.Set) bool {
	for _, p := range set.Policies {
		if p.Name == policy.DefaultPolicyName {
			return true
		}
	}
	return false
}

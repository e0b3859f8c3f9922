package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/sizing"
)

// parseRates reads --size-at values: "RATE" for every policy, or
// "POLICY=RATE"; a rate is first writes per second, "/s" allowed.
func parseRates(args []string, set *policy.Set) (map[string]float64, error) {
	names := map[string]bool{}
	for _, p := range set.Policies {
		names[p.Name] = true
	}
	rates := map[string]float64{}
	for _, a := range args {
		name, v, named := strings.Cut(a, "=")
		if !named {
			v, name = a, ""
		}
		r, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), "/s"), 64)
		if err != nil || r < 0 || r > 1e9 {
			return nil, fmt.Errorf("%q: want RATE or POLICY=RATE, a rate being first writes per second (500 or 500/s)", a)
		}
		if named && !names[name] {
			return nil, fmt.Errorf("%q: no policy is named %q", a, name)
		}
		if !named {
			for n := range names {
				if _, set := rates[n]; !set {
					rates[n] = r
				}
			}
			continue
		}
		rates[name] = r
	}
	return rates, nil
}

// printSizing writes one row per policy with a rate and a total.
func printSizing(w io.Writer, set *policy.Set, rates map[string]float64) {
	fmt.Fprintf(w, "# Redis used_memory for the completed records each policy keeps for its retention, by the kind of\n"+
		"# answer it stores (bytes per record measured with redis 7.0.15 on generated answers: a ~1.2 KiB\n"+
		"# object, a ~17 KiB list of 14, a ~280-byte error, and a mix of them; docs/performance.md, \"Memory per\n"+
		"# stored answer\"). Leave room above it for fragmentation, replication and client buffers (docs/redis.md).\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "policy\tstored\tretention\twrites/s\trecords\t")
	for _, c := range sizing.Classes {
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw)
	total := map[sizing.Class]float64{}
	var records float64
	for _, p := range set.Policies {
		rate, ok := rates[p.Name]
		if !ok {
			continue
		}
		r := sizing.Estimate(p, rate)
		stored := string(r.Mode)
		if p.Encrypt {
			stored += ", sealed"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%g\t%.0f\t", p.Name, stored, hours(r.Retention), r.Rate, r.Records)
		for _, c := range sizing.Classes {
			fmt.Fprintf(tw, "%s\t", sizing.Human(r.Bytes[c]))
			total[c] += r.Bytes[c]
		}
		fmt.Fprintln(tw)
		records += r.Records
	}
	fmt.Fprintf(tw, "total\t\t\t\t%.0f\t", records)
	for _, c := range sizing.Classes {
		fmt.Fprintf(tw, "%s\t", sizing.Human(total[c]))
	}
	fmt.Fprintln(tw)
	_ = tw.Flush()
}

// hours writes a retention as a policy file does: 72h, 1h30m, 30s.
func hours(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

package loadtest

import (
	"slices"
	"time"
)

// dist summarises latencies.
type dist struct {
	n              int
	p50, p99, p999 time.Duration
}

func summarise(samples []time.Duration) dist {
	if len(samples) == 0 {
		return dist{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.5) - 1 // nearest rank
		return s[min(max(i, 0), len(s)-1)]
	}
	return dist{n: len(s), p50: at(0.50), p99: at(0.99), p999: at(0.999)}
}

// median of the values, the mean of the middle two for an even count.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDuration(v []time.Duration) time.Duration {
	f := make([]float64, len(v))
	for i, d := range v {
		f[i] = float64(d)
	}
	return time.Duration(median(f))
}

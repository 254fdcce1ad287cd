package loadtest

import (
	"math"
	"slices"
	"time"
)

// Summary is the distribution of a set of durations.
type Summary struct {
	N   int           `json:"n"`
	Min time.Duration `json:"min_ns"`
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

// Percentile returns the p-th percentile (0 < p ≤ 100) of sorted, which is
// in ascending order, by the nearest-rank method: the smallest value that at
// least p percent of the values are less than or equal to. It is 0 for an
// empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Summarize returns the distribution of ds, which it does not modify.
func Summarize(ds []time.Duration) Summary {
	s := slices.Clone(ds)
	slices.Sort(s)
	return Summary{
		N:   len(s),
		Min: Percentile(s, 0),
		P50: Percentile(s, 50),
		P90: Percentile(s, 90),
		P99: Percentile(s, 99),
		Max: Percentile(s, 100),
	}
}

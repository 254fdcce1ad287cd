package loadtest

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		var ds []time.Duration
		for _, n := range ns {
			ds = append(ds, time.Duration(n)*time.Millisecond)
		}
		return ds
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{name: "empty", sorted: nil, p: 50, want: 0},
		{name: "one value, p50", sorted: ms(7), p: 50, want: 7 * time.Millisecond},
		{name: "one value, p100", sorted: ms(7), p: 100, want: 7 * time.Millisecond},
		{name: "p50 of two is the lower", sorted: ms(1, 2), p: 50, want: 1 * time.Millisecond},
		{name: "p51 of two is the upper", sorted: ms(1, 2), p: 51, want: 2 * time.Millisecond},
		{name: "p50 of four", sorted: ms(1, 2, 3, 4), p: 50, want: 2 * time.Millisecond},
		{name: "p90 of ten", sorted: ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), p: 90, want: 9 * time.Millisecond},
		{name: "p99 of ten is the max", sorted: ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), p: 99, want: 10 * time.Millisecond},
		{name: "p0 is the min", sorted: ms(3, 5, 8), p: 0, want: 3 * time.Millisecond},
		{name: "tiny p is the min", sorted: ms(3, 5, 8), p: 0.001, want: 3 * time.Millisecond},
		{name: "p100 is the max", sorted: ms(3, 5, 8), p: 100, want: 8 * time.Millisecond},
		{name: "above 100 is the max", sorted: ms(3, 5, 8), p: 150, want: 8 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func TestPercentileOfHundred(t *testing.T) {
	var sorted []time.Duration
	for i := 1; i <= 100; i++ {
		sorted = append(sorted, time.Duration(i))
	}
	for _, p := range []float64{1, 50, 90, 99, 100} {
		if got := Percentile(sorted, p); got != time.Duration(p) {
			t.Errorf("Percentile(1..100, %v) = %v, want %v", p, got, time.Duration(p))
		}
	}
}

func TestSummarize(t *testing.T) {
	in := []time.Duration{5, 1, 4, 2, 3}
	got := Summarize(in)
	want := Summary{N: 5, Min: 1, P50: 3, P90: 5, P99: 5, Max: 5}
	if got != want {
		t.Errorf("Summarize(%v) = %+v, want %+v", in, got, want)
	}
	if in[0] != 5 {
		t.Errorf("Summarize sorted its input: %v", in)
	}
	if got := Summarize(nil); got != (Summary{}) {
		t.Errorf("Summarize(nil) = %+v, want zero", got)
	}
}

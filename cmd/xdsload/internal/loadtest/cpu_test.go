package loadtest

import (
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name string
		stat string
		want time.Duration
		ok   bool
	}{
		{"plain", "42 (xdsload) S 1 42 42 0 -1 4194560 100 0 0 0 150 25 0 0 20 0 8 0", 1750 * time.Millisecond, true},
		{"name with spaces and parentheses", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0", 70 * time.Millisecond, true},
		{"no name", "7 a R 1", 0, false},
		{"too short", "7 (a) R 1 2 3", 0, false},
		{"not a number", "7 (a) R 1 7 7 0 -1 0 0 0 0 0 x 4 0 0", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatCPU(tt.stat)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("parseStatCPU = %v, %v; want %v, ok %v", got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestReadCPUOfThisProcess(t *testing.T) {
	if _, err := ReadCPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if sampleCPU(0) != 0 {
		t.Error("sampleCPU(0) is not 0")
	}
}

func TestCPUPerChange(t *testing.T) {
	c := CPU{Server: 400 * time.Millisecond, Upstream: 40 * time.Millisecond, Changes: 4}
	c.perChange(10)
	if c.PerChange != 100*time.Millisecond || c.PerClientPerChange != 10*time.Millisecond || c.UpstreamPerChange != 10*time.Millisecond {
		t.Errorf("per change: %+v", c)
	}
	none := CPU{Server: time.Second}
	none.perChange(10)
	if none.PerChange != 0 {
		t.Errorf("no changes: %+v", none)
	}
}

//go:build !unix

package relay

import "time"

// cpuTime is not read here: the benchmarks report 0 CPU.
func cpuTime() time.Duration { return 0 }

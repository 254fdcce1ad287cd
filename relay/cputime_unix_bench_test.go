//go:build unix

package relay

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time the process has used, user and system: unlike
// the wall clock, it does not count the time other processes of a shared
// machine take the CPUs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

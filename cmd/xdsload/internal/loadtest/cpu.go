package loadtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of the CPU times in /proc/PID/stat: USER_HZ, which
// is 100 on every Linux architecture Go runs on (sysconf(_SC_CLK_TCK)).
const clockTick = 10 * time.Millisecond

// ReadCPU returns the CPU time process pid has used, user and system, from
// /proc/PID/stat; its resolution is a clock tick, 10ms.
func ReadCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu: %w", err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime, fields 14 and 15 of a /proc/PID/stat
// line, counted after the command name: it is in parentheses and may hold
// spaces and parentheses itself.
func parseStatCPU(stat string) (time.Duration, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("cpu: no command name in %q", stat)
	}
	fields := strings.Fields(stat[end+1:]) // fields[0] is field 3, state
	if len(fields) < 13 {
		return 0, fmt.Errorf("cpu: %d fields after the command name, want 13 or more", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}

// sampleCPU is ReadCPU with 0 for no process or an error.
func sampleCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	cpu, _ := ReadCPU(pid)
	return cpu
}

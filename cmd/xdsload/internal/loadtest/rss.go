package loadtest

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ReadRSS returns the resident set size of process pid, in bytes, from
// /proc/PID/status.
func ReadRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("rss: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("rss: VmRSS %q: %w", rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("rss: %w", err)
	}
	return 0, fmt.Errorf("rss: no VmRSS in /proc/%d/status", pid)
}

// sampleRSS is ReadRSS with 0 for no process or an error.
func sampleRSS(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	rss, _ := ReadRSS(pid)
	return rss
}

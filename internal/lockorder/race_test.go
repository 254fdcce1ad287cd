//go:build race

package lockorder

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// The recorder orders no goroutines: two goroutines that take checked
// locks (the same pair, so the second reads what the first recorded) and
// share a variable with no synchronization of their own are still a data
// race to the race detector. Run in a child process, which the detector
// ends with its report.
func TestRecordingHidesNoRace(t *testing.T) {
	if os.Getenv("LOCKORDER_RACE_CHILD") == "1" {
		racyThroughCheckedLocks()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRecordingHidesNoRace$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOCKORDER_RACE_CHILD=1", "GORACE=halt_on_error=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "WARNING: DATA RACE") {
		t.Fatalf("the child's race went unreported (%v):\n%s", err, out)
	}
}

var shared int

func racyThroughCheckedLocks() {
	// Locks of the same classes, not the same locks: two locks taken in
	// turn would order the goroutines by themselves.
	var a1, a2 Mutex[classA]
	var b1, b2 Mutex[classB]
	done := make(chan struct{})
	go func() {
		shared = 1
		a1.Lock()
		b1.Lock()
		b1.Unlock()
		a1.Unlock()
		close(done)
	}()
	// Wait for the goroutine with the detector's synchronization events
	// off, so that the wait orders nothing either.
	runtime.RaceDisable()
	<-done
	runtime.RaceEnable()
	a2.Lock()
	b2.Lock()
	b2.Unlock()
	a2.Unlock()
	sink = shared
}

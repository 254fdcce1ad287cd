// Package lockorder holds the relay's locks to the order the design gives
// them (docs/architecture.md, "Locks"). A Mutex or RWMutex is a sync one
// with a class: a zero-size type whose LockName is the name the design
// gives the lock ("Cache.mu"), so a lock costs no memory beyond its sync
// mutex and its zero value is ready to use.
//
// In a race build (go test -race, the test command of CI) every lock taken
// is recorded per goroutine, and each pair of classes taken one under the
// other (held → taken) is recorded once, with where each of the two was
// taken. Observed returns those pairs and Check holds them to the design's
// table: a pair the table does not list, or a cycle, is a failure that
// names both call sites. Outside a race build the recording is a constant
// false branch that the compiler removes: a lock costs what its sync mutex
// costs (BenchmarkMutex).
//
// The recorder's own bookkeeping is invisible to the race detector: it
// runs with the detector's synchronization events off and touches its
// shared state only in functions the detector does not instrument, so
// that taking one checked lock never orders two goroutines that a real
// data race between them would need unordered.
package lockorder

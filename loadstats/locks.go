package loadstats

// The lock classes of the package: each names its lock as
// docs/architecture.md ("Locks") does, so that the race run holds the
// order in which they are taken to the design (internal/lockorder).

type storeMu struct{}

func (storeMu) LockName() string { return "loadstats.Store.mu" }

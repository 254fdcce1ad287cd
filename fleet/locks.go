package fleet

// The lock classes of the package: each names its lock as
// docs/architecture.md ("Locks") does, so that the race run holds the
// order in which they are taken to the design (internal/lockorder).

type membersMu struct{}

func (membersMu) LockName() string { return "Members.mu" }

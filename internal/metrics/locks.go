package metrics

// The lock classes of the package: each names its lock as
// docs/architecture.md ("Locks") does, so that the race run holds the
// order in which they are taken to the design (internal/lockorder).

type registryMu struct{}

func (registryMu) LockName() string { return "metrics.Registry.mu" }

type vecMu struct{}

func (vecMu) LockName() string { return "Vec.mu" }

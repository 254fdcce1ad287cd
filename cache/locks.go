package cache

// The lock classes of the package: each names its lock as
// docs/architecture.md ("Locks") does, so that the race run holds the
// order in which they are taken to the design (internal/lockorder).

type cacheWakeMu struct{}

func (cacheWakeMu) LockName() string { return "Cache.wakeMu" }

type cacheMu struct{}

func (cacheMu) LockName() string { return "Cache.mu" }

type watchMu struct{}

func (watchMu) LockName() string { return "Watch.mu" }

type convergenceMu struct{}

func (convergenceMu) LockName() string { return "convergence.mu" }

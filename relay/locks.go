package relay

// The lock classes of the package: each names its lock as
// docs/architecture.md ("Locks") does, so that the race run holds the
// order in which they are taken to the design (internal/lockorder).

type relayMu struct{}

func (relayMu) LockName() string { return "Relay.mu" }

type goroutinesMu struct{}

func (goroutinesMu) LockName() string { return "goroutines.mu" }

type groupScrapeMu struct{}

func (groupScrapeMu) LockName() string { return "registerGroupMetrics.mu" }

type convergenceScrapeMu struct{}

func (convergenceScrapeMu) LockName() string { return "registerConvergenceMetrics.mu" }

type persistHealthMu struct{}

func (persistHealthMu) LockName() string { return "persistHealth.mu" }

type configWarningsMu struct{}

func (configWarningsMu) LockName() string { return "configWarnings.mu" }

type fleetWiringMu struct{}

func (fleetWiringMu) LockName() string { return "fleetWiring.mu" }

package downstream

// The lock classes of the package: each names its lock as
// docs/architecture.md ("Locks") does, so that the race run holds the
// order in which they are taken to the design (internal/lockorder).

type deadlinesMu struct{}

func (deadlinesMu) LockName() string { return "deadlines.mu" }

type streamStatusMu struct{}

func (streamStatusMu) LockName() string { return "streamStatus.mu" }

type registryMu struct{}

func (registryMu) LockName() string { return "registry.mu" }

type bucketMu struct{}

func (bucketMu) LockName() string { return "bucket.mu" }

type pumpMu struct{}

func (pumpMu) LockName() string { return "pump.mu" }

type sendPoolWatchMu struct{}

func (sendPoolWatchMu) LockName() string { return "sendPool.watchMu" }

type sendPoolMu struct{}

func (sendPoolMu) LockName() string { return "sendPool.mu" }

type sendConnMu struct{}

func (sendConnMu) LockName() string { return "sendConn.mu" }

type sendConnWarmMu struct{}

func (sendConnWarmMu) LockName() string { return "sendConn.warmMu" }

type liveSetMu struct{}

func (liveSetMu) LockName() string { return "liveSet.mu" }

type warmInboxMu struct{}

func (warmInboxMu) LockName() string { return "warmInbox.mu" }

type connSetMu struct{}

func (connSetMu) LockName() string { return "connSet.mu" }

type sendGuardMu struct{}

func (sendGuardMu) LockName() string { return "sendGuard.mu" }

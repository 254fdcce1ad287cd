package upstream

// The lock classes of the package: each names its lock as
// docs/architecture.md ("Locks") does, so that the race run holds the
// order in which they are taken to the design (internal/lockorder).

type attemptsMu struct{}

func (attemptsMu) LockName() string { return "Attempts.mu" }

type framesMu struct{}

func (framesMu) LockName() string { return "upstream.Frames.mu" }

type frameConnWmu struct{}

func (frameConnWmu) LockName() string { return "frameConn.wmu" }

type fileMu struct{}

func (fileMu) LockName() string { return "File.mu" }

type clientMu struct{}

func (clientMu) LockName() string { return "Client.mu" }

type foundMu struct{}

func (foundMu) LockName() string { return "found.mu" }

type loadReporterMu struct{}

func (loadReporterMu) LockName() string { return "LoadReporter.mu" }

type rejectionsMu struct{}

func (rejectionsMu) LockName() string { return "Rejections.mu" }

type routedFeedMu struct{}

func (routedFeedMu) LockName() string { return "routedFeed.mu" }

type viewMu struct{}

func (viewMu) LockName() string { return "view.mu" }

type switchMu struct{}

func (switchMu) LockName() string { return "Switch.mu" }

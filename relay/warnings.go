package relay

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// configWarnings are the configuration choices the relay runs with but
// warns about (allow-all authorization, an open admin endpoint): each is
// logged at warn at startup naming its key and the document (and section)
// that explains it, set to 1 in xdsrelay_config_warnings{key}, and listed on the
// private /readyz.
type configWarnings struct {
	// Read-only after newConfigWarnings.
	gauge *metrics.Vec

	mu    sync.Mutex
	lines []string // guarded by mu: for /readyz, in the order warned
}

func newConfigWarnings(m *metrics.Registry) *configWarnings {
	return &configWarnings{gauge: m.Gauge("xdsrelay_config_warnings",
		"Configuration choices warned about at startup, by configuration key: 1 each (the log and the private /readyz say why).", "key")}
}

// warn logs why at warn, naming key and doc, the document that explains it
// (docs/operations.md#admin-exposure), and counts it.
func (w *configWarnings) warn(log *slog.Logger, key, doc, why string) {
	log.Warn(why, "key", key, "doc", doc)
	w.gauge.With(key).Set(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, fmt.Sprintf("warning: %s (see %s)", why, doc))
}

// detail is the warnings as the private /readyz shows them.
func (w *configWarnings) detail() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

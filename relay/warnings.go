package relay

import (
	"fmt"
	"log/slog"

	"github.com/xdsrelay/xdsrelay/internal/lockorder"
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

	mu    lockorder.Mutex[configWarningsMu]
	lines []string // guarded by mu: for /readyz, in the order warned
}

// newConfigWarnings registers the gauge with a series at 0 for each key
// that may be warned about, so that it is on /metrics from the start.
func newConfigWarnings(m *metrics.Registry, keys []string) *configWarnings {
	return &configWarnings{gauge: m.Gauge("xdsrelay_config_warnings",
		"Configuration choices warned about at startup, by configuration key: 1 each (the log and the private /readyz say why).", "key").
		ZeroEach(keys...)}
}

// warnedKeys are the configuration keys the relay may warn about with cfg.
func warnedKeys(cfg Config) []string {
	keys := []string{"admin.address", "downstream.authorization.mode", "upstream.group_by", "upstream.tls.insecure_skip_verify"}
	for i := range cfg.Upstreams {
		keys = append(keys, fmt.Sprintf("upstreams[%d].tls.insecure_skip_verify", i))
	}
	return keys
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

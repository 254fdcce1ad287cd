package downstream

import (
	"strings"
	"testing"

	"github.com/xdsrelay/xdsrelay/internal/authz"
	"github.com/xdsrelay/xdsrelay/internal/metrics"
)

// Every variant a client can be denied on, load report streams included,
// has its xdsrelay_downstream_denied_total series at 0 from the start, so
// that an alert on increase() sees the first denial.
func TestDeniedSeriesExistAtZero(t *testing.T) {
	reg := &metrics.Registry{}
	if _, err := New(Options{Groups: noGroups{}, Metrics: reg}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if _, err := reg.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	for _, variant := range []string{"sotw-ads", "delta-ads", "sotw", "delta", "fetch", "rest", variantLRS} {
		for _, reason := range []string{authz.ReasonIdentity, authz.ReasonNode} {
			want := `xdsrelay_downstream_denied_total{reason="` + reason + `",variant="` + variant + `"} 0` + "\n"
			if !strings.Contains(out.String(), want) {
				t.Errorf("no %q on /metrics at start", strings.TrimSpace(want))
			}
		}
	}
}

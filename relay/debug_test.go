package relay

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

func getJSON(t *testing.T, r *Relay, path string, v any) {
	t.Helper()
	code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+path)
	if code != http.StatusOK {
		t.Fatalf("%s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("%s: %v in %s", path, err, body)
	}
}

// /debug/clients and /debug/groups read the same status as CSDS: each
// client's group, variant and last ACK/NACK; each group's upstream and
// subscription. /debug/cache lists a group's resources, with bodies.
func TestDebugEndpoints(t *testing.T) {
	r := csdsFixture(t)
	var clients []debugClient
	eventually(t, "the NACK in /debug/clients", func() bool {
		getJSON(t, r, "/debug/clients", &clients)
		return len(clients) == 2 && len(clients[1].Types) == 1 && clients[1].Types[0].NackError != ""
	})
	acker, nacker := clients[0], clients[1]
	if acker.Node != "acker" || acker.Variant != "delta-ads" || nacker.Node != "nacker" || nacker.Variant != "sotw-ads" {
		t.Fatalf("clients: %+v", clients)
	}
	if acker.Group == "" || acker.Group != nacker.Group {
		t.Fatalf("groups %q and %q, want the same one", acker.Group, nacker.Group)
	}
	if at := acker.Types[0]; at.Type != resourcev3.EndpointType || at.Subscribed != 2 || at.Wildcard || at.NackError != "" {
		t.Fatalf("acker's EDS: %+v", at)
	}
	if nt := nacker.Types[0]; nt.NackError != "bad endpoint e1" || nt.NackAt == nil || nt.Subscribed != 1 {
		t.Fatalf("nacker's EDS: %+v", nt)
	}

	var groups []debugGroup
	getJSON(t, r, "/debug/groups", &groups)
	if len(groups) != 1 || groups[0].Key != acker.Group || !groups[0].Connected || groups[0].LastResponse == nil || groups[0].Clients != 2 {
		t.Fatalf("groups: %+v", groups)
	}
	if ty := groups[0].Types; len(ty) != 1 || ty[0].Type != resourcev3.EndpointType || ty[0].Names != 2 {
		t.Fatalf("group's subscription: %+v", ty)
	}

	q := "/debug/cache?group=" + url.QueryEscape(acker.Group) + "&type=" + url.QueryEscape(resourcev3.EndpointType)
	var res []debugResource
	getJSON(t, r, q, &res)
	if len(res) != 1 || res[0].Name != "e1" || res[0].Version == "" || res[0].Resource != nil {
		t.Fatalf("cache without bodies: %+v", res)
	}
	getJSON(t, r, q+"&bodies=true", &res)
	if len(res) != 1 || !strings.Contains(string(res[0].Resource), "10.0.0.1") || !strings.Contains(string(res[0].Resource), "ClusterLoadAssignment") {
		t.Fatalf("cache with bodies: %+v", res)
	}

	// Without a type, the groups and their types.
	var list []DebugCacheGroup
	for _, path := range []string{"/debug/cache", "/debug/cache?group=" + url.QueryEscape(acker.Group)} {
		getJSON(t, r, path, &list)
		if len(list) != 1 || list[0].Group != acker.Group || list[0].Resources != 1 || len(list[0].Types) != 1 ||
			list[0].Types[0].Type != resourcev3.EndpointType || list[0].Types[0].Resources != 1 || list[0].Types[0].Version == 0 {
			t.Fatalf("%s: %+v", path, list)
		}
	}

	for path, want := range map[string]int{
		"/debug/cache?type=" + url.QueryEscape(resourcev3.EndpointType):            http.StatusBadRequest,
		"/debug/cache?group=nope&type=" + url.QueryEscape(resourcev3.EndpointType): http.StatusNotFound,
		"/debug/cache?group=nope": http.StatusNotFound,
	} {
		if code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+path); code != want {
			t.Errorf("%s: %d %s, want %d", path, code, body, want)
		}
	}
}

// On a public admin address, /debug/ is refused with 403 and says why.
func TestDebugRefusedOnPublicAdmin(t *testing.T) {
	r, _ := relayWithDownGroup(t, publicAdmin(t))
	for _, path := range []string{"/debug/clients", "/debug/groups", "/debug/cache?group=" + url.QueryEscape(keyOf("tenant-a")) + "&type=" + url.QueryEscape(resourcev3.ClusterType)} {
		code, body := get(t, http.DefaultClient, "http://"+r.AdminAddr()+path)
		if code != http.StatusForbidden || !strings.Contains(body, "loopback") || strings.Contains(body, "tenant-a") {
			t.Errorf("%s: %d %q, want 403 saying why", path, code, body)
		}
	}
}

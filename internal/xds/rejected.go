package xds

import (
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// A forwarded NACK (docs/architecture.md, "Forwarded NACKs") carries, in
// its error_detail's details, one google.rpc.ErrorInfo per version that
// clients rejected: the message is for people, the details for a relay
// above, which counts the rejection against the resource they name.
const (
	RejectedDomain = "xdsrelay"
	RejectedReason = "CLIENTS_REJECTED"
)

// Rejected is one version that clients of a relay rejected.
type Rejected struct {
	Type, Name, Version string
	Rejected, Clients   int    // how many clients rejected it, of those that were sent it
	Error               string // the first client's error, clipped
	// AnyVersion is the AnyVersion of the resource's bytes at Version, if
	// the relay still holds them: what a relay above that versions the
	// resource otherwise knows it by.
	AnyVersion string
}

// Detail is r as a forwarded NACK's detail.
func (r Rejected) Detail() (*anypb.Any, error) {
	return anypb.New(&errdetails.ErrorInfo{Reason: RejectedReason, Domain: RejectedDomain, Metadata: map[string]string{
		"type": r.Type, "name": r.Name, "version": r.Version, "rejected": strconv.Itoa(r.Rejected),
		"clients": strconv.Itoa(r.Clients), "error": Clip(r.Error), "any": r.AnyVersion}})
}

// Forwarded is what a NACK's error_detail says a relay's clients
// rejected: nothing if it is not a forwarded NACK. At most max are read.
func Forwarded(st *status.Status, max int) []Rejected {
	var out []Rejected
	for _, d := range st.GetDetails() {
		if len(out) == max {
			break
		}
		var info errdetails.ErrorInfo
		if d.UnmarshalTo(&info) != nil || info.GetDomain() != RejectedDomain || info.GetReason() != RejectedReason {
			continue
		}
		m := info.GetMetadata()
		r := Rejected{Type: m["type"], Name: m["name"], Version: m["version"], Error: Clip(m["error"]), AnyVersion: m["any"]}
		r.Rejected, r.Clients = count(m["rejected"]), count(m["clients"])
		if r.Name != "" && r.Version != "" {
			out = append(out, r)
		}
	}
	return out
}

// count reads a count from a relay below: 0 if it does not parse or is
// negative.
func count(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

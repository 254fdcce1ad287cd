package downstream

import (
	"fmt"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// A client's config dump: what the client of one stream holds, in the form
// of Envoy's /config_dump (envoy.admin.v3.ConfigDump), read from the
// stream's status record (the read-only view CSDS reads) and, for the
// bodies, from the group's cache at the versions the record names. Nothing
// is copied or kept for it.

// dumpOrder is the order of the typed dumps in a ConfigDump, Envoy's.
var dumpOrder = []string{resourcev3.ClusterType, resourcev3.ExtensionConfigType, resourcev3.EndpointType,
	resourcev3.ListenerType, resourcev3.ScopedRouteType, resourcev3.RouteType, resourcev3.SecretType}

// ConfigDump is what the client of c holds, of every type or of typeURL
// alone: for each type Envoy's config dump has a form for (Clusters,
// ECDS, Endpoints, Listeners, Scoped routes, Routes, Secrets) and that
// the client holds something of, that form, its version_info (Listeners,
// Clusters) the version_info the client last ACKed (none on an
// incremental stream, whose requests carry none), each resource with
// the version it was sent, when, and its client_status; then one CSDS
// ClientConfig whose generic_xds_configs hold the rest: the types Envoy's
// dump has no form for (VHDS, LEDS, RTDS), and the names the typed forms
// cannot show, those without a body: subscribed and not sent, told not to
// exist, NACKed (the client keeps an earlier version, which the record
// does not name: the error_state says what it rejected), or sent at a
// version the cache has let go. A Secret is shown without its body: the
// admin endpoint never shows a private key.
func ConfigDump(c ClientStatus, typeURL string) (*adminpb.ConfigDump, error) {
	dumps := map[string]typeDump{}
	rest := &statuspb.ClientConfig{}
	for _, t := range c.Types {
		if typeURL != "" && t.TypeURL != typeURL {
			continue
		}
		bodies, err := bodiesOf(c, t)
		if err != nil {
			return nil, err
		}
		d := newTypeDump(t.TypeURL, t.AckVersion)
		for i, r := range t.Resources {
			if d != nil && (bodies[i] != nil || t.TypeURL == resourcev3.SecretType && r.Version != "" && r.State != Nacked) {
				d.add(r, bodies[i])
				dumps[t.TypeURL] = d // shown once it holds something
				continue
			}
			g := genericConfig(t.TypeURL, r)
			g.XdsConfig = bodies[i]
			rest.GenericXdsConfigs = append(rest.GenericXdsConfigs, g)
		}
	}
	out := &adminpb.ConfigDump{}
	for _, typeURL := range dumpOrder {
		if d := dumps[typeURL]; d != nil {
			if err := appendAny(out, d.message()); err != nil {
				return nil, err
			}
		}
	}
	if len(rest.GenericXdsConfigs) > 0 {
		if err := appendAny(out, rest); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func appendAny(out *adminpb.ConfigDump, m proto.Message) error {
	a, err := anypb.New(m)
	if err != nil {
		return fmt.Errorf("config dump: %w", err)
	}
	out.Configs = append(out.Configs, a)
	return nil
}

// bodiesOf decodes the resources of t the client was sent and did not
// NACK, at the versions it was sent, from the group's cache: nil for each
// the cache no longer holds at that version, and for every Secret.
func bodiesOf(c ClientStatus, t TypeStatus) ([]*anypb.Any, error) {
	out := make([]*anypb.Any, len(t.Resources))
	if t.TypeURL == resourcev3.SecretType || c.Cache == nil {
		return out, nil
	}
	var idx []int
	var names, versions []string
	for i, r := range t.Resources {
		if r.Version != "" && r.State != Nacked {
			idx = append(idx, i)
			names, versions = append(names, r.Name), append(versions, r.Version)
		}
	}
	for j, res := range c.Cache.AtVersions(t.TypeURL, names, versions) {
		if res == nil {
			continue
		}
		a, err := xds.DecodeAny(res)
		if err != nil {
			return nil, fmt.Errorf("config dump: %w", err)
		}
		out[idx[j]] = a
	}
	return out, nil
}

// typeDump collects one type's resources in that type's config dump form.
type typeDump interface {
	add(r ResourceStatus, body *anypb.Any)
	message() proto.Message
}

// newTypeDump is typeURL's config dump form, at version (the client's
// last ACK); nil for a type Envoy's dump has no form for.
func newTypeDump(typeURL, version string) typeDump {
	switch typeURL {
	case resourcev3.ClusterType:
		return &clustersDump{m: &adminpb.ClustersConfigDump{VersionInfo: version}}
	case resourcev3.ExtensionConfigType:
		return &ecdsDump{m: &adminpb.EcdsConfigDump{}}
	case resourcev3.EndpointType:
		return &endpointsDump{m: &adminpb.EndpointsConfigDump{}}
	case resourcev3.ListenerType:
		return &listenersDump{m: &adminpb.ListenersConfigDump{VersionInfo: version}}
	case resourcev3.ScopedRouteType:
		return &scopedRoutesDump{m: &adminpb.ScopedRoutesConfigDump{}}
	case resourcev3.RouteType:
		return &routesDump{m: &adminpb.RoutesConfigDump{}}
	case resourcev3.SecretType:
		return &secretsDump{m: &adminpb.SecretsConfigDump{}}
	}
	return nil
}

// sentAt is when r was last sent, as the dumps' last_updated; nil if never.
func sentAt(r ResourceStatus) *timestamppb.Timestamp {
	if r.Sent.IsZero() {
		return nil
	}
	return timestamppb.New(r.Sent)
}

// clientStatus is r's state as the dumps' client_status.
func clientStatus(r ResourceStatus) adminpb.ClientResourceStatus {
	return genericConfig("", r).GetClientStatus()
}

type clustersDump struct{ m *adminpb.ClustersConfigDump }

func (d *clustersDump) add(r ResourceStatus, body *anypb.Any) {
	d.m.DynamicActiveClusters = append(d.m.DynamicActiveClusters, &adminpb.ClustersConfigDump_DynamicCluster{
		VersionInfo: r.Version, Cluster: body, LastUpdated: sentAt(r), ClientStatus: clientStatus(r)})
}
func (d *clustersDump) message() proto.Message { return d.m }

type ecdsDump struct{ m *adminpb.EcdsConfigDump }

func (d *ecdsDump) add(r ResourceStatus, body *anypb.Any) {
	d.m.EcdsFilters = append(d.m.EcdsFilters, &adminpb.EcdsConfigDump_EcdsFilterConfig{
		VersionInfo: r.Version, EcdsFilter: body, LastUpdated: sentAt(r), ClientStatus: clientStatus(r)})
}
func (d *ecdsDump) message() proto.Message { return d.m }

type endpointsDump struct{ m *adminpb.EndpointsConfigDump }

func (d *endpointsDump) add(r ResourceStatus, body *anypb.Any) {
	d.m.DynamicEndpointConfigs = append(d.m.DynamicEndpointConfigs, &adminpb.EndpointsConfigDump_DynamicEndpointConfig{
		VersionInfo: r.Version, EndpointConfig: body, LastUpdated: sentAt(r), ClientStatus: clientStatus(r)})
}
func (d *endpointsDump) message() proto.Message { return d.m }

type listenersDump struct{ m *adminpb.ListenersConfigDump }

func (d *listenersDump) add(r ResourceStatus, body *anypb.Any) {
	d.m.DynamicListeners = append(d.m.DynamicListeners, &adminpb.ListenersConfigDump_DynamicListener{Name: r.Name,
		ActiveState:  &adminpb.ListenersConfigDump_DynamicListenerState{VersionInfo: r.Version, Listener: body, LastUpdated: sentAt(r)},
		ClientStatus: clientStatus(r)})
}
func (d *listenersDump) message() proto.Message { return d.m }

type scopedRoutesDump struct {
	m *adminpb.ScopedRoutesConfigDump
}

func (d *scopedRoutesDump) add(r ResourceStatus, body *anypb.Any) {
	d.m.DynamicScopedRouteConfigs = append(d.m.DynamicScopedRouteConfigs, &adminpb.ScopedRoutesConfigDump_DynamicScopedRouteConfigs{
		Name: r.Name, VersionInfo: r.Version, ScopedRouteConfigs: []*anypb.Any{body}, LastUpdated: sentAt(r), ClientStatus: clientStatus(r)})
}
func (d *scopedRoutesDump) message() proto.Message { return d.m }

type routesDump struct{ m *adminpb.RoutesConfigDump }

func (d *routesDump) add(r ResourceStatus, body *anypb.Any) {
	d.m.DynamicRouteConfigs = append(d.m.DynamicRouteConfigs, &adminpb.RoutesConfigDump_DynamicRouteConfig{
		VersionInfo: r.Version, RouteConfig: body, LastUpdated: sentAt(r), ClientStatus: clientStatus(r)})
}
func (d *routesDump) message() proto.Message { return d.m }

// secretsDump shows each Secret's name, version and status, never its
// body (add is given none).
type secretsDump struct{ m *adminpb.SecretsConfigDump }

func (d *secretsDump) add(r ResourceStatus, _ *anypb.Any) {
	d.m.DynamicActiveSecrets = append(d.m.DynamicActiveSecrets, &adminpb.SecretsConfigDump_DynamicSecret{
		Name: r.Name, VersionInfo: r.Version, LastUpdated: sentAt(r), ClientStatus: clientStatus(r)})
}
func (d *secretsDump) message() proto.Message { return d.m }

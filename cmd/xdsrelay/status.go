package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	adminpb "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	statuspb "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherpb "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/relay"
)

func newStatusCmd() *cobra.Command {
	var (
		cf      clientFlags
		admin   string
		nodeID  string
		output  string
		timeout time.Duration
		sum     bool
	)
	cmd := &cobra.Command{
		Use:   "status --server ADDR [--node-id ID] [-o table|wide|json] | status --summary --admin ADMIN_ADDR",
		Short: "Show what each client node has been sent and has acknowledged (CSDS)",
		Long: `Asks the server's Client Status Discovery Service
(envoy.service.status.v3.ClientStatusDiscoveryService, FetchClientStatus) at
--server, the relay's xDS port, for its clients' status and prints, per node
and type, one short version of what the client holds and whether it is
SYNCED, STALE or NACKED, as istioctl proxy-status does; -o wide adds the
per-resource versions and how many resources are ACKED, NACKED, REQUESTED
and DOES_NOT_EXIST.

With --summary it reads the relay's admin endpoint instead (--admin
ADMIN_ADDR, with the TLS flags as the admin commands take them; GET
/debug/convergence) and prints, per group and type, its resources and its
clients, each counted once: how many accepted everything they were sent,
rejected something, are pending, are behind (owed a change not sent yet)
and are waiting for a first answer, from counters the relay keeps as it
goes: it costs the relay what the answer costs, whatever the number of
clients. --server still names the
admin endpoint with --summary, deprecated.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "wide" && output != "json" {
				return usageError{cmd, fmt.Errorf("-o: %q is not table, wide or json", output)}
			}
			if sum {
				if nodeID != "" {
					return usageError{cmd, errors.New("--summary and --node-id: the summary counts every client")}
				}
				af, err := summaryAdmin(cmd, &cf, admin, timeout)
				if err != nil {
					return err
				}
				return statusSummary(cmd, af, output)
			}
			if cmd.Flags().Changed("admin") {
				return usageError{cmd, errors.New("--admin names the admin endpoint, which status --summary reads; status asks the xDS port, named by --server")}
			}
			if err := required(cmd, "server"); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			resp, err := fetchStatus(ctx, &cf, nodeID)
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			return printStatus(cmd.OutOrStdout(), resp, output == "wide")
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&admin, "admin", "", "with --summary, the relay's admin endpoint `ADDR` (admin.address)")
	cmd.Flags().StringVar(&nodeID, "node-id", "", "only the node with this `ID` (all nodes without it)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "`FORMAT`: table, wide (with every version and the counts of resources) or json (the response as protojson)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	cmd.Flags().BoolVar(&sum, "summary", false, "per group and type, the clients that accepted, rejected, are pending and behind, from the relay's admin endpoint at --admin")
	return cmd
}

// summaryAdmin is the admin endpoint status --summary reads: --admin, or
// --server, deprecated there, with the TLS flags.
func summaryAdmin(cmd *cobra.Command, cf *clientFlags, admin string, timeout time.Duration) (adminFlags, error) {
	af := adminFlags{server: admin, files: cf.files, timeout: timeout, flag: "--admin"}
	switch fs := cmd.Flags(); {
	case fs.Changed("admin") && fs.Changed("server"):
		return af, usageError{cmd, errors.New("--summary with --admin and --server: name the admin endpoint once, with --admin")}
	case fs.Changed("server"):
		deprecatedServer(cmd)
		af.server, af.flag = cf.server, "--server"
	case !fs.Changed("admin"):
		return af, usageError{cmd, errors.New("--summary needs --admin: the relay's admin endpoint (admin.address)")}
	}
	if cf.tls && !cf.files.Enabled() && !strings.Contains(af.server, "://") {
		af.server = "https://" + af.server
	}
	return af, nil
}

// statusSummary prints /debug/convergence's summary, asked of the admin
// endpoint af.
func statusSummary(cmd *cobra.Command, af adminFlags, output string) error {
	b, err := af.do(cmd.Context(), http.MethodGet, "/debug/convergence", url.Values{"limit": {"0"}}, "")
	if err != nil {
		return err
	}
	var dc relay.DebugConvergence
	if err := json.Unmarshal(b, &dc); err != nil {
		return fmt.Errorf("the admin endpoint's answer: %w", err)
	}
	if output == "json" {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(dc.Summary)
	}
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	from := fleetFrom(dc.FleetPaths)
	fmt.Fprint(tw, "GROUP\tTYPE\tRESOURCES\tCLIENTS\tACCEPTED\tREJECTED\tPENDING\tBEHIND\tWAITING")
	if from != nil {
		fmt.Fprint(tw, "\tPEERS\tFROM") // the fleet peers' streams, not among the clients
	}
	fmt.Fprintln(tw)
	for _, s := range dc.Summary {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d", orDash(s.Group), xds.TypeAbbrev(s.Type), s.Resources,
			s.Subscribed, s.Accepted, s.Rejected, s.Pending, s.Behind, s.Waiting)
		if from != nil {
			fmt.Fprint(tw, "\t", s.PeerStreams, "\t", orDash(from[s.Group]))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// fleetFrom is, with a fleet, where each group comes from, by group:
// control-plane, fallback, or the peer it is drawn from ("peer ADDR");
// nil without a fleet.
func fleetFrom(paths []relay.FleetGroup) map[string]string {
	if len(paths) == 0 {
		return nil
	}
	out := map[string]string{}
	for _, p := range paths {
		switch p.Source {
		case "peer":
			out[p.Group] = "peer " + p.Peer
		default:
			out[p.Group] = strings.ReplaceAll(p.Source, "_", "-")
		}
	}
	return out
}

// fetchStatus asks the server for its clients' status, nodeID's only when
// it is set.
func fetchStatus(ctx context.Context, cf *clientFlags, nodeID string) (*statuspb.ClientStatusResponse, error) {
	cc, done, err := cf.dial(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	req := &statuspb.ClientStatusRequest{}
	if nodeID != "" {
		req.NodeMatchers = []*matcherpb.NodeMatcher{{NodeId: &matcherpb.StringMatcher{
			MatchPattern: &matcherpb.StringMatcher_Exact{Exact: nodeID},
		}}}
	}
	resp, err := statuspb.NewClientStatusDiscoveryServiceClient(cc).FetchClientStatus(ctx, req)
	if err != nil {
		if wrong := cf.explain(err); isWrongPort(wrong) {
			return nil, wrong
		}
		return nil, fmt.Errorf("status: %s: %w", cf.server, err)
	}
	return resp, nil
}

// typeStatus is one node's status for one type.
type typeStatus struct {
	versions []string // per-resource versions, each once
	held     []held   // resources with a version, for the type's version
	counts   map[adminpb.ClientResourceStatus]int
	stale    int // sent a version, not acknowledged yet (CSDS: STALE)
}

// held is a resource a client holds a version of.
type held struct{ name, version string }

// statusColumns are the client statuses counted, in the wide table's
// order.
var statusColumns = []adminpb.ClientResourceStatus{
	adminpb.ClientResourceStatus_ACKED,
	adminpb.ClientResourceStatus_NACKED,
	adminpb.ClientResourceStatus_REQUESTED,
	adminpb.ClientResourceStatus_DOES_NOT_EXIST,
}

// The states of a client's type, as istioctl proxy-status names them.
const (
	synced  = "SYNCED"   // everything sent was acknowledged
	stale   = "STALE"    // something sent is not acknowledged yet
	nacked  = "NACKED"   // the client rejected something it holds
	notSent = "NOT SENT" // subscribed, nothing sent yet
)

// state is the type's state: NACKED over STALE over SYNCED; NOT SENT
// when the client holds nothing of it.
func (ts *typeStatus) state() string {
	c := ts.counts
	switch {
	case c[adminpb.ClientResourceStatus_NACKED] > 0:
		return nacked
	case ts.stale > 0:
		return stale
	case c[adminpb.ClientResourceStatus_ACKED]+c[adminpb.ClientResourceStatus_DOES_NOT_EXIST] > 0:
		return synced
	}
	return notSent
}

// version is the type's one version: the first digits of the
// xds.StateVersion of the resources the client holds a version of, which
// a REST poll of the same resources answers whole. "-" if it holds none.
func (ts *typeStatus) version() string {
	if len(ts.held) == 0 {
		return "-"
	}
	slices.SortFunc(ts.held, func(a, b held) int { return strings.Compare(a.name, b.name) })
	v := xds.NewStateVersion()
	for _, h := range ts.held {
		v.Add(h.name, h.version)
	}
	return v.String()[:xds.ShortVersionLen]
}

// printStatus writes one row per node and type, as istioctl proxy-status
// does per proxy: the type's one version and its state; wide adds the
// per-resource versions and the counts of resources by status.
func printStatus(w io.Writer, resp *statuspb.ClientStatusResponse, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "NODE\tCLUSTER\tTYPE\tVERSION\tSTATUS")
	if wide {
		fmt.Fprint(tw, "\tRESOURCE VERSIONS")
		for _, s := range statusColumns {
			fmt.Fprint(tw, "\t", s)
		}
	}
	fmt.Fprintln(tw)
	for _, cfg := range resp.GetConfig() {
		byType, order := summarize(cfg.GetGenericXdsConfigs())
		for _, typeURL := range order {
			ts := byType[typeURL]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", orDash(cfg.GetNode().GetId()), orDash(cfg.GetNode().GetCluster()), xds.TypeAbbrev(typeURL), ts.version(), ts.state())
			if wide {
				fmt.Fprintf(tw, "\t%s", versions(ts.versions))
				for _, s := range statusColumns {
					fmt.Fprintf(tw, "\t%d", ts.counts[s])
				}
			}
			fmt.Fprintln(tw)
		}
	}
	return tw.Flush()
}

// summarize groups a node's resources by type, types in the relay's order
// (then unknown ones by URL).
func summarize(configs []*statuspb.ClientConfig_GenericXdsConfig) (map[string]*typeStatus, []string) {
	byType := map[string]*typeStatus{}
	var order []string
	for _, c := range configs {
		ts := byType[c.GetTypeUrl()]
		if ts == nil {
			ts = &typeStatus{counts: map[adminpb.ClientResourceStatus]int{}}
			byType[c.GetTypeUrl()] = ts
			order = append(order, c.GetTypeUrl())
		}
		if v := c.GetVersionInfo(); v != "" {
			ts.held = append(ts.held, held{c.GetName(), v})
			if !slices.Contains(ts.versions, v) {
				ts.versions = append(ts.versions, v)
			}
		}
		if c.GetConfigStatus() == statuspb.ConfigStatus_STALE ||
			c.GetClientStatus() == adminpb.ClientResourceStatus_REQUESTED && c.GetVersionInfo() != "" {
			ts.stale++ // sent, not acknowledged yet
		}
		ts.counts[c.GetClientStatus()]++
	}
	slices.SortFunc(order, func(a, b string) int {
		if ra, rb := xds.Rank(a), xds.Rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	return byType, order
}

// versions is one version, or the first two sorted and how many more.
func versions(vs []string) string {
	slices.Sort(vs)
	switch {
	case len(vs) == 0:
		return "-"
	case len(vs) <= 2:
		return strings.Join(vs, ",")
	default:
		return fmt.Sprintf("%s,%s +%d", vs[0], vs[1], len(vs)-2)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printJSON writes m as protojson (an Any of a type not linked raw, see
// xds.MarshalJSON), indented by encoding/json: protojson's own layout
// varies on purpose from build to build.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := xds.MarshalJSON(m)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, b, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = buf.WriteTo(w)
	return err
}

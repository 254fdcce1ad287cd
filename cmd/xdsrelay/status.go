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
		nodeID  string
		output  string
		timeout time.Duration
		sum     bool
	)
	cmd := &cobra.Command{
		Use:   "status --server ADDR [--node-id ID] [-o table|json] | status --summary --server ADMIN_ADDR",
		Short: "Show what each client node has been sent and has acknowledged (CSDS)",
		Long: `Asks the server's Client Status Discovery Service
(envoy.service.status.v3.ClientStatusDiscoveryService, FetchClientStatus) for
its clients' status and prints, per node and type, the versions sent and how
many resources are ACKED, NACKED, REQUESTED and DOES_NOT_EXIST.

With --summary it asks the relay's admin endpoint instead (--server
ADMIN_ADDR, with the TLS flags as the admin commands take them; GET
/debug/convergence) and prints, per group and type, how many clients
accepted, rejected, are pending and are behind on the current versions,
from counters the relay keeps as it goes: it costs the relay what the
answer costs, whatever the number of clients.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := required(cmd, "server"); err != nil {
				return err
			}
			if output != "table" && output != "json" {
				return usageError{cmd, fmt.Errorf("-o: %q is not table or json", output)}
			}
			if sum {
				if nodeID != "" {
					return usageError{cmd, errors.New("--summary and --node-id: the summary counts every client")}
				}
				return statusSummary(cmd, cf, output, timeout)
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
			return printStatus(cmd.OutOrStdout(), resp)
		},
	}
	cf.add(cmd)
	cmd.Flags().StringVar(&nodeID, "node-id", "", "only the node with this `ID` (all nodes without it)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "`FORMAT`: table or json (the response as protojson)")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	cmd.Flags().BoolVar(&sum, "summary", false, "per group and type, the clients that accepted, rejected, are pending and behind, from the relay's admin endpoint at --server")
	return cmd
}

// statusSummary prints /debug/convergence's summary, asked of the admin
// endpoint at cf.server with cf's TLS files.
func statusSummary(cmd *cobra.Command, cf clientFlags, output string, timeout time.Duration) error {
	af := adminFlags{server: cf.server, files: cf.files, timeout: timeout}
	if cf.tls && !cf.files.Enabled() && !strings.Contains(af.server, "://") {
		af.server = "https://" + af.server
	}
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
	fmt.Fprint(tw, "GROUP\tTYPE\tRESOURCES\tSUBSCRIBED\tACCEPTED\tREJECTED\tPENDING\tBEHIND\tOLDER")
	if from != nil {
		fmt.Fprint(tw, "\tFROM")
	}
	fmt.Fprintln(tw)
	for _, s := range dc.Summary {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d", orDash(s.Group), xds.TypeAbbrev(s.Type), s.Resources,
			s.Subscribed, s.Accepted, s.Rejected, s.Pending, s.Behind, s.Older)
		if from != nil {
			fmt.Fprint(tw, "\t", orDash(from[s.Group]))
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
		return nil, fmt.Errorf("status: %s: %w", cf.server, err)
	}
	return resp, nil
}

// typeStatus is one node's status for one type.
type typeStatus struct {
	versions []string
	counts   map[adminpb.ClientResourceStatus]int
}

// statusColumns are the client statuses counted, in the table's order.
var statusColumns = []adminpb.ClientResourceStatus{
	adminpb.ClientResourceStatus_ACKED,
	adminpb.ClientResourceStatus_NACKED,
	adminpb.ClientResourceStatus_REQUESTED,
	adminpb.ClientResourceStatus_DOES_NOT_EXIST,
}

// printStatus writes one row per node and type, as istioctl proxy-status
// does per proxy.
func printStatus(w io.Writer, resp *statuspb.ClientStatusResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "NODE\tCLUSTER\tTYPE\tVERSION")
	for _, s := range statusColumns {
		fmt.Fprint(tw, "\t", s)
	}
	fmt.Fprintln(tw)
	for _, cfg := range resp.GetConfig() {
		byType, order := summarize(cfg.GetGenericXdsConfigs())
		for _, typeURL := range order {
			ts := byType[typeURL]
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s", orDash(cfg.GetNode().GetId()), orDash(cfg.GetNode().GetCluster()), xds.TypeAbbrev(typeURL), versions(ts.versions))
			for _, s := range statusColumns {
				fmt.Fprintf(tw, "\t%d", ts.counts[s])
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
		if v := c.GetVersionInfo(); v != "" && !slices.Contains(ts.versions, v) {
			ts.versions = append(ts.versions, v)
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

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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
)

func newStatusCmd() *cobra.Command {
	var (
		cf      clientFlags
		nodeID  string
		output  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status --server ADDR [--node-id ID] [-o table|json]",
		Short: "Show what each client node has been sent and has acknowledged (CSDS)",
		Long: `Asks the server's Client Status Discovery Service
(envoy.service.status.v3.ClientStatusDiscoveryService, FetchClientStatus) for
its clients' status and prints, per node and type, the versions sent and how
many resources are ACKED, NACKED, REQUESTED and DOES_NOT_EXIST.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := required(cmd, "server"); err != nil {
				return err
			}
			if output != "table" && output != "json" {
				return usageError{cmd, fmt.Errorf("-o: %q is not table or json", output)}
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
	return cmd
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

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

func newGuardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "guard",
		Short: "Act on the mass-removal guard's holds",
		Args:  usageArgs(cobra.NoArgs),
	}
	cmd.AddCommand(newGuardReleaseCmd())
	return cmd
}

func newGuardReleaseCmd() *cobra.Command {
	var (
		server, group, typ string
		files              creds.TLS
		timeout            time.Duration
	)
	cmd := &cobra.Command{
		Use:   "release --server ADMIN_ADDR [--group G] [--type T]",
		Short: "Release held removals: the clients get them now",
		Long: `Asks the relay's admin endpoint (POST /debug/guard/release) to end the
guard's holds and apply their removals: of one group (the key as
/debug/groups shows it) or all, of one type (a REST short name such as
endpoints, or a type URL) or all. The admin endpoint must be private to the
caller: loopback, or admin.tls with a client certificate (an https://
address with --ca-file, --cert-file and --key-file).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := required(cmd, "server"); err != nil {
				return err
			}
			if typ != "" {
				if _, ok := xds.TypeNamed(typ); !ok {
					return usageError{cmd, fmt.Errorf("--type: %q is not one of %s, or a type URL", typ, strings.Join(xds.TypeShortNames(), ", "))}
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			client := http.DefaultClient
			if files.Enabled() {
				rl, err := creds.NewReloader(ctx, files, slog.New(slog.DiscardHandler))
				if err != nil {
					return err
				}
				defer rl.Close()
				client = &http.Client{Transport: &http.Transport{TLSClientConfig: rl.ClientConfig()}}
			}
			return releaseHolds(ctx, client, cmd.OutOrStdout(), server, group, typ)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&server, "server", "", "the relay's admin endpoint `ADDR` (host:port, or http:// or https:// URL) (required)")
	fs.StringVar(&group, "group", "", "only the group with this `KEY` (all groups without it)")
	fs.StringVar(&typ, "type", "", "only this `TYPE` (all types without it)")
	fs.StringVar(&files.CAFile, "ca-file", "", "verify an https:// admin endpoint against the CA bundle in `FILE`")
	fs.StringVar(&files.CertFile, "cert-file", "", "present the client certificate in `FILE` (admin.tls.client_ca_file; with --key-file)")
	fs.StringVar(&files.KeyFile, "key-file", "", "the client certificate's private key `FILE`")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "give up after this long")
	return cmd
}

// heldRelease is one hold that ended, as the admin endpoint answers.
type heldRelease struct {
	Group string `json:"group"`
	Type  string `json:"type"`
	Names int    `json:"names"`
}

func releaseHolds(ctx context.Context, client *http.Client, out io.Writer, server, group, typ string) error {
	base := server
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	q := url.Values{}
	if group != "" {
		q.Set("group", group)
	}
	if typ != "" {
		q.Set("type", typ)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+"/debug/guard/release?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("--server: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var released []heldRelease
	if err := json.Unmarshal(body, &released); err != nil {
		return fmt.Errorf("the admin endpoint's answer: %w", err)
	}
	if len(released) == 0 {
		fmt.Fprintln(out, "nothing was held")
	}
	for _, h := range released {
		fmt.Fprintf(out, "released %d removals of %s in group %q\n", h.Names, xds.ShortName(h.Type), h.Group)
	}
	return nil
}

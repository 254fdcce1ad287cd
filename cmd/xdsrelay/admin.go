package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/internal/creds"
	"github.com/xdsrelay/xdsrelay/internal/xds"
)

// adminFlags are how the admin commands (admin, groups, guard release,
// rollout release, wait, status --summary) reach the relay's admin
// endpoint, named by --admin: plain HTTP on a loopback address, or HTTPS
// with a client certificate that admin.tls.client_ca_file verifies, for
// instance through kubectl port-forward to a pod that serves admin.tls
// (docs/kubernetes.md: Admin access in a cluster).
type adminFlags struct {
	server  string
	files   creds.TLS
	timeout time.Duration
	// flag is the flag that named server, for errors: --admin, or the
	// deprecated --server.
	flag string
}

func (f *adminFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "admin", "", "the relay's admin endpoint `ADDR` (admin.address: host:port, or an http:// or https:// URL; https with the TLS flags) (required)")
	f.addTLS(cmd)
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "give up after this long")
}

// addWithServer is add and, bound to the same value, --server: what the
// admin commands that came before --admin took (admin, guard release,
// rollout release), kept there as a deprecated alias (check warns),
// hidden from the help. The commands that came with --admin never took
// it.
func (f *adminFlags) addWithServer(cmd *cobra.Command) {
	f.add(cmd)
	fs := cmd.Flags()
	fs.StringVar(&f.server, "server", "", "deprecated: --admin")
	_ = fs.MarkHidden("server")
}

// check refuses a command line that names no admin endpoint, or names it
// twice, and warns on the deprecated --server.
func (f *adminFlags) check(cmd *cobra.Command) error {
	f.flag = "--admin"
	switch fs := cmd.Flags(); {
	case fs.Changed("admin") && fs.Changed("server"):
		return usageError{cmd, errors.New("--admin and --server: name the admin endpoint once, with --admin")}
	case fs.Changed("server"):
		f.flag = "--server"
		deprecatedServer(cmd)
	case !fs.Changed("admin"):
		return usageError{cmd, errors.New("--admin is required: the relay's admin endpoint (admin.address)")}
	}
	return nil
}

// deprecatedServer warns that --server named the admin endpoint.
func deprecatedServer(cmd *cobra.Command) {
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: --server is deprecated here: name the admin endpoint with --admin (--server is the xDS port, for status and watch)\n", cmd.CommandPath())
}

// addTLS adds the admin endpoint's TLS flags.
func (f *adminFlags) addTLS(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.files.CAFile, "ca-file", "", "verify the admin endpoint's certificate against the CA bundle in `FILE`")
	fs.StringVar(&f.files.CertFile, "cert-file", "", "present the client certificate in `FILE` (one admin.tls.client_ca_file verifies; with --key-file)")
	fs.StringVar(&f.files.KeyFile, "key-file", "", "the client certificate's private key `FILE`")
	fs.StringVar(&f.files.ServerName, "server-name", "", "verify the admin endpoint's certificate for `NAME` instead of the --admin host (through kubectl port-forward, the name in the relay's certificate)")
}

// base is the admin endpoint's URL without a path: --admin as given, or
// with https:// when a TLS flag is set, http:// otherwise.
func (f *adminFlags) base() string {
	b := f.server
	if !strings.Contains(b, "://") {
		scheme := "http://"
		if f.files.Enabled() {
			scheme = "https://"
		}
		b = scheme + b
	}
	return strings.TrimSuffix(b, "/")
}

// do sends one request to the admin endpoint and returns the body of a 2xx
// answer; any other status is an error with the answer's first line,
// clipped. An endpoint that answers as an xDS port does is a wrongPort.
func (f *adminFlags) do(ctx context.Context, method, path string, q url.Values, body string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	sniff := sniffed{http1: true}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return sniff.dial(ctx, addr) }}
	defer tr.CloseIdleConnections()
	if f.files.Enabled() {
		rl, err := creds.NewReloader(ctx, f.files, slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, err
		}
		defer rl.Close()
		tr.TLSClientConfig = sniff.tls(rl.ClientConfig())
	}
	target := f.base() + path
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	flag := cmp.Or(f.flag, "--admin")
	req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		if wrong := adminWrongPort(flag, f.server, err, &sniff, nil); wrong != nil {
			return nil, wrong
		}
		return nil, unanswered(method, path, err)
	}
	defer resp.Body.Close()
	if wrong := adminWrongPort(flag, f.server, nil, nil, resp.Header); wrong != nil {
		return nil, wrong
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminAnswer))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		return nil, refusal{code: resp.StatusCode, err: fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, xds.Clip(line))}
	}
	return b, nil
}

// unanswered is the error of a request that got no answer, in words: a
// refused connection is nothing listening, a deadline no answer in time.
func unanswered(method, path string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // not the whole URL again
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%s %s: connection refused: nothing listens at that address (the admin endpoint is admin.address, 127.0.0.1:9901 by default)", method, path)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s %s: no answer in time (--timeout)", method, path)
	}
	return fmt.Errorf("%s %s: %w", method, path, err)
}

// refusal is the admin endpoint's answer other than 2xx.
type refusal struct {
	code int
	err  error
}

func (r refusal) Error() string { return r.err.Error() }

// maxAdminAnswer bounds what the admin commands read of an answer: more
// than any admin body but a profile.
const maxAdminAnswer = 256 << 20

func newAdminCmd() *cobra.Command {
	var (
		af     adminFlags
		method string
		data   string
	)
	cmd := &cobra.Command{
		Use:   "admin --admin ADMIN_ADDR [-X METHOD] [-d BODY] PATH",
		Short: "Call the relay's admin endpoint (/readyz, /debug/...), with a client certificate over admin.tls",
		Long: `Sends one request to the relay's admin endpoint and prints the answer:
PATH is /readyz, /debug/groups, /debug/clients, /debug/cache?group=G&type=T,
/debug/loglevel (-X PUT -d debug), /debug/pprof/heap (with admin.pprof), ...
The /debug/ paths and the detailed /readyz answer only a private caller: on
a loopback admin.address, or over admin.tls with a client certificate that
admin.tls.client_ca_file verifies (--ca-file, --cert-file, --key-file, and
--server-name through kubectl port-forward). Exits 1 when the endpoint
answers anything but 2xx, with its status and first line, or answers as
an xDS port does. --server is a deprecated name of --admin.`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := af.check(cmd); err != nil {
				return err
			}
			method = strings.ToUpper(method)
			switch method {
			case http.MethodGet, http.MethodPost, http.MethodPut:
			default:
				return usageError{cmd, fmt.Errorf("-X: %q is not GET, POST or PUT", method)}
			}
			u, err := url.Parse(args[0])
			if err != nil || !strings.HasPrefix(u.Path, "/") || u.Host != "" {
				return usageError{cmd, fmt.Errorf("PATH: %q is not a path such as /debug/groups", args[0])}
			}
			b, err := af.do(cmd.Context(), method, u.Path, u.Query(), data)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	af.addWithServer(cmd)
	cmd.Flags().StringVarP(&method, "request", "X", http.MethodGet, "the `METHOD`: GET, POST or PUT")
	cmd.Flags().StringVarP(&data, "data", "d", "", "the request's `BODY` (PUT /debug/loglevel: debug, info, warn or error)")
	return cmd
}

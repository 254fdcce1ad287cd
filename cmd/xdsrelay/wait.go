package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/xdsrelay/xdsrelay/internal/xds"
	"github.com/xdsrelay/xdsrelay/relay"
)

// waitPoll is how often wait asks the relays again.
const waitPoll = 250 * time.Millisecond

// waitShown bounds the resources a verdict names, and the relays it names
// as not counted.
const waitShown = 10

type waitFlags struct {
	tls      adminFlags // the TLS flags; server is set per replica
	servers  []string   // --admin
	legacy   []string   // --server, its deprecated name
	typ      string
	names    []string
	version  string
	fraction float64
	timeout  time.Duration
	tiers    bool
}

func newWaitCmd() *cobra.Command {
	var f waitFlags
	cmd := &cobra.Command{
		Use:   "wait --admin ADMIN_ADDR --type T [--name N]... [--version V] [--fraction F] [--timeout D] [--tiers]",
		Short: "Wait until the clients have accepted a version (their ACK), or say who rejected it",
		Long: `Asks the relays' admin endpoints (GET /debug/convergence) until the
clients subscribed to the resources of --type (--name narrows them) have
accepted --version (each resource's current version without it): exits 0
once --fraction of them (1.0: all) did, each client counted once however
many resources it holds (with --name, --version or --tiers, --fraction of
each resource's clients), 1 when --timeout passes first or as soon as
rejections make the fraction unreachable (with 1.0, any rejection),
printing how many are behind, pending and rejecting, with the clients'
errors and node ids, or at once when an endpoint refuses (4xx) or
answers as an xDS port does; 2 for a command line it does not take.

--admin is repeatable (--server is its deprecated name); a DNS name that
resolves to several addresses (a headless Service of replicas) is asked
at each, and the counts are summed.
The endpoints must be private to the caller: loopback, or admin.tls with a
client certificate (--ca-file, --cert-file, --key-file; --server-name
through kubectl port-forward). An ACK means a client accepted the
configuration, not that its traffic uses it yet.

A relay whose upstream is another relay is one client of it: its ACK says
it has the version, not that its clients do. With --tiers, wait also asks
the lower relays each relay lists (those that advertise their admin
endpoint with admin.advertise_address), tier by tier (at most 8 tiers
and 1,000 relays, with the same TLS flags), and counts the clients at the
leaves: a lower relay's clients take its place as a client of the relay
above. A lower relay's resource is at the version when its version, or
the upstream version it came with, is one waited for at the tier above:
there its version, or the hash of its bytes, which a SotW tier below
holds it at. A lower relay that does not answer counts as not converged, and is
named (the first 10 such relays; past them, how many more).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(cmd); err != nil {
				return err
			}
			return f.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&f.servers, "admin", nil, "a relay's admin endpoint `ADDR` (admin.address: host:port or URL), repeatable; a name with several addresses is asked at each (required)")
	fs.StringArrayVar(&f.legacy, "server", nil, "deprecated: --admin")
	_ = fs.MarkHidden("server")
	fs.StringVar(&f.typ, "type", "", "the resources' `TYPE`: clusters, Cluster, cds or a type URL (required)")
	fs.StringArrayVar(&f.names, "name", nil, "only the resource `NAME`, repeatable (every resource of the type without it)")
	fs.StringVar(&f.version, "version", "", "the `VERSION` to wait for (each resource's current version in the relay without it)")
	fs.Float64Var(&f.fraction, "fraction", 1.0, "the `FRACTION` of subscribed clients that must accept, in (0, 1]")
	fs.DurationVar(&f.timeout, "timeout", time.Minute, "give up after this long")
	fs.BoolVar(&f.tiers, "tiers", false, "count the clients of the lower relays the relays list, tier by tier, in their place")
	f.tls.addTLS(cmd)
	return cmd
}

// check refuses a command line wait does not take, and resolves --type.
func (f *waitFlags) check(cmd *cobra.Command) error {
	f.tls.flag = "--admin"
	if len(f.legacy) > 0 {
		deprecatedServer(cmd)
		f.servers, f.tls.flag = append(f.servers, f.legacy...), "--server"
	}
	if len(f.servers) == 0 {
		return usageError{cmd, errors.New("--admin is required: the relays' admin endpoints (admin.address)")}
	}
	if err := required(cmd, "type"); err != nil {
		return err
	}
	typeURL, err := xds.ParseType(f.typ)
	if err != nil {
		return usageError{cmd, fmt.Errorf("--type: %w", err)}
	}
	f.typ = typeURL
	if !(f.fraction > 0 && f.fraction <= 1) {
		return usageError{cmd, fmt.Errorf("--fraction: %v is not in (0, 1]", f.fraction)}
	}
	if f.timeout <= 0 {
		return usageError{cmd, fmt.Errorf("--timeout: %v is not positive", f.timeout)}
	}
	return nil
}

// waitCount is what the relays say of the clients, summed. Without
// --name, --version and --tiers, it counts clients, each once, from the
// relays' summaries (clients); else it counts, per resource (type and
// name, whatever its group and relay), the clients of that resource, and
// each resource is judged on its own.
type waitCount struct {
	typ         string // the type waited for, to name it
	byResource  bool
	named       []tierKey         // the resources --name asks for: each must have clients
	answered    int               // relays asked that answered
	clients     tally             // counted as clients
	res         map[tierKey]tally // counted per resource
	shown       []string          // lines about resources not there yet, at most waitShown
	more        int               // resources not shown
	unknown     []string          // replicas that did not answer, and why; at most waitShown
	unknownMore int               // more of those, not shown
	// all are the clients of the type on every relay counted (their
	// summaries, each lower relay left out of its parent's), and peers
	// the fleet peers' streams, which are not clients (each member counts
	// its own).
	all, peers int
}

// tally is where some clients stand.
type tally struct{ subscribed, accepted, rejected, pending, behind, waiting int }

func (t *tally) add(o tally) {
	t.subscribed += o.subscribed
	t.accepted += o.accepted
	t.rejected += o.rejected
	t.pending += o.pending
	t.behind += o.behind
	t.waiting += o.waiting
}

// need is how many of the tally's clients must accept.
func (t tally) need(fraction float64) int {
	return int(math.Ceil(fraction*float64(t.subscribed) - 1e-9))
}

// addResource adds one relay's count of a resource's clients.
func (c *waitCount) addResource(k tierKey, t tally) {
	if c.res == nil {
		c.res = map[tierKey]tally{}
	}
	r := c.res[k]
	r.add(t)
	c.res[k] = r
}

// notCounted records a replica or lower relay whose clients are not
// counted, and why; past waitShown of them, only how many.
func (c *waitCount) notCounted(line string) {
	if len(c.unknown) == waitShown {
		c.unknownMore++
		return
	}
	c.unknown = append(c.unknown, line)
}

// subscribed reports whether any client subscribes to what is waited for.
func (c waitCount) subscribed() bool {
	if !c.byResource {
		return c.clients.subscribed > 0
	}
	for _, t := range c.res {
		if t.subscribed > 0 {
			return true
		}
	}
	return false
}

// unclaimed are the resources --name asks for that no client of the
// relays asked subscribes to: a relay has nothing to say of them, so the
// wait is not over while there is one.
func (c waitCount) unclaimed() []tierKey {
	var out []tierKey
	for _, k := range c.named {
		if c.res[k].subscribed == 0 {
			out = append(out, k)
		}
	}
	return out
}

// verdict reports whether the fraction is reached (of the clients, or of
// each resource's clients); lost, whether it no longer can be.
func (c waitCount) verdict(fraction float64) (done, lost bool) {
	if !c.subscribed() || len(c.unknown) > 0 {
		return false, false
	}
	if !c.byResource {
		need := c.clients.need(fraction)
		return c.clients.accepted >= need, c.clients.subscribed-c.clients.rejected < need
	}
	done = len(c.unclaimed()) == 0
	for _, t := range c.res {
		need := t.need(fraction)
		done = done && t.accepted >= need
		lost = lost || t.subscribed-t.rejected < need
	}
	return done, lost
}

// one is the tally of the one resource waited for, if there is one.
func (c waitCount) one() (tally, bool) {
	if !c.byResource {
		return c.clients, true
	}
	if len(c.res) != 1 || len(c.named) > 1 {
		return tally{}, false
	}
	for _, t := range c.res {
		return t, true
	}
	return tally{}, false
}

// resourcesAt counts the resources waited for (those with clients, and
// those --name asks for) and those where pass holds.
func (c waitCount) resourcesAt(pass func(tally) bool) (n, of int) {
	for _, t := range c.res {
		if t.subscribed == 0 {
			continue
		}
		of++
		if pass(t) {
			n++
		}
	}
	return n, of + len(c.unclaimed())
}

// accepted says that the fraction was reached.
func (c waitCount) accepted(fraction float64) string {
	if t, ok := c.one(); ok {
		return fmt.Sprintf("%d of %d clients accepted%s", t.accepted, t.subscribed, c.peersApart())
	}
	n, _ := c.resourcesAt(func(tally) bool { return true })
	if c.all == 0 && c.peers == 0 {
		return fmt.Sprintf("%d resources accepted, each by %s", n, ofItsClients(fraction))
	}
	return fmt.Sprintf("%d resources accepted, each by %s (%s%s)", n, ofItsClients(fraction), numbered(c.all, "client"), c.peersApart())
}

// peersApart says how many fleet peer streams were left out of the
// clients; "" for none.
func (c waitCount) peersApart() string {
	if c.peers == 0 {
		return ""
	}
	return fmt.Sprintf(" (%s not counted as clients)", numbered(c.peers, "fleet peer stream"))
}

// rejected says that rejections made the fraction unreachable.
func (c waitCount) rejected(fraction float64) error {
	if t, ok := c.one(); ok {
		return fmt.Errorf("wait: %d of %d clients rejected it: %d of them must accept (--fraction %v), %d at most still can",
			t.rejected, t.subscribed, t.need(fraction), fraction, t.subscribed-t.rejected)
	}
	n, of := c.resourcesAt(func(t tally) bool { return t.subscribed-t.rejected < t.need(fraction) })
	return fmt.Errorf("wait: %d of %d resources rejected by so many of their clients that they cannot be accepted by %s", n, of, ofItsClients(fraction))
}

// short says that the timeout came first.
func (c waitCount) short(fraction float64, timeout time.Duration) error {
	if c.answered == 0 && len(c.unknown) > 0 {
		return fmt.Errorf("wait: no relay could be counted in %v: %s", timeout, c.unknown[0])
	}
	if !c.subscribed() && len(c.named) == 0 {
		return fmt.Errorf("wait: no client subscribed to the %s resources in %v: a relay has nothing to say of resources no client of it holds", xds.ShortName(c.typ), timeout)
	}
	var err error
	if t, ok := c.one(); ok {
		err = fmt.Errorf("wait: %d of %d clients accepted after %v; %d must (--fraction %v)", t.accepted, t.subscribed, timeout, t.need(fraction), fraction)
	} else {
		n, of := c.resourcesAt(func(t tally) bool { return t.accepted >= t.need(fraction) })
		err = fmt.Errorf("wait: %d of %d resources accepted by %s after %v", n, of, ofTheirClients(fraction), timeout)
	}
	if none := c.unclaimed(); len(none) > 0 {
		err = fmt.Errorf("%w; no client subscribes to %s", err, keysShown(none))
	}
	if n := len(c.unknown) + c.unknownMore; n > 0 {
		err = fmt.Errorf("%w; %s not counted (above: which, and why)", err, numbered(n, "relay"))
	}
	return err
}

// ofItsClients says a fraction of a resource's clients.
func ofItsClients(fraction float64) string {
	if fraction == 1 {
		return "all of its clients"
	}
	return percent(fraction) + " of its clients or more"
}

// ofTheirClients says a fraction of each resource's clients.
func ofTheirClients(fraction float64) string {
	if fraction == 1 {
		return "all of their clients"
	}
	return percent(fraction) + " of their clients"
}

func percent(fraction float64) string {
	return strconv.FormatFloat(fraction*100, 'g', 4, 64) + "%"
}

// keysShown names resources, the first waitShown of them.
func keysShown(ks []tierKey) string {
	var names []string
	for i, k := range ks {
		if i == waitShown {
			names = append(names, fmt.Sprintf("%d more", len(ks)-i))
			break
		}
		names = append(names, xds.ShortName(k.typ)+"/"+k.name)
	}
	return strings.Join(names, ", ")
}

// numbered is n and noun, with an s unless n is 1.
func numbered(n int, noun string) string {
	return fmt.Sprintf("%d %s", n, plural(n, noun, noun+"s"))
}

func (f *waitFlags) run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	tick := time.NewTicker(waitPoll)
	defer tick.Stop()
	var (
		last waitCount // the last count taken before the timeout
		have bool      // whether there is one
	)
	for {
		c, refused := f.count(ctx)
		if refused != nil {
			return refused // asking again would be answered the same
		}
		if ctx.Err() != nil && have {
			c = last // cut short by the timeout: what was known before it
		}
		last, have = c, true
		done, lost := c.verdict(f.fraction)
		switch {
		case done:
			fmt.Fprintln(out, c.accepted(f.fraction))
			return nil
		case lost:
			c.print(out)
			return c.rejected(f.fraction)
		}
		select {
		case <-ctx.Done():
			c.print(out)
			return c.short(f.fraction, f.timeout)
		case <-tick.C:
		}
	}
}

// print says where the clients stand, bounded.
func (c waitCount) print(out io.Writer) {
	switch t, ok := c.one(); {
	case c.answered == 0:
		// Nothing counted: only why, below.
	case ok:
		fmt.Fprintf(out, "%s: %d accepted, %d rejected, %d pending, %d behind", numbered(t.subscribed, "client"), t.accepted, t.rejected, t.pending, t.behind)
		if !c.byResource {
			fmt.Fprintf(out, ", %d waiting", t.waiting)
		}
		fmt.Fprintln(out, c.peersApart())
	default:
		n, of := c.resourcesAt(func(t tally) bool { return t.accepted == t.subscribed })
		fmt.Fprintf(out, "%s: %d accepted by all of their clients", numbered(of, "resource"), n)
		if none := c.unclaimed(); len(none) > 0 {
			fmt.Fprintf(out, ", %d with no client", len(none))
		}
		fmt.Fprintln(out)
	}
	for _, u := range c.unknown {
		fmt.Fprintln(out, u)
	}
	if c.unknownMore > 0 {
		fmt.Fprintf(out, "... and %d more not counted\n", c.unknownMore)
	}
	for _, l := range c.shown {
		fmt.Fprintln(out, l)
	}
	if c.more > 0 {
		fmt.Fprintf(out, "... and %d more resources\n", c.more)
	}
	for i, k := range c.unclaimed() {
		if i == waitShown {
			fmt.Fprintf(out, "... and %d more resources with no client\n", len(c.unclaimed())-i)
			break
		}
		fmt.Fprintf(out, "%s/%s: no client subscribes to it on the relays asked (a relay has nothing to say of it until one does)\n", xds.ShortName(k.typ), k.name)
	}
	if !c.subscribed() && len(c.named) == 0 && c.answered > 0 {
		fmt.Fprintf(out, "no client subscribes to the %s resources\n", xds.ShortName(c.typ))
	}
}

// count asks every replica once and sums what they say; refused is a
// replica's 4xx answer (not private to the caller, an unknown path), which
// ends the wait at once.
func (f *waitFlags) count(ctx context.Context) (c waitCount, refused error) {
	c.typ, c.byResource = f.typ, f.tiers || f.version != "" || len(f.names) > 0
	for _, n := range f.names {
		// The relays clip a long name as they show it.
		if k := (tierKey{f.typ, xds.Clip(n)}); !slices.Contains(c.named, k) {
			c.named = append(c.named, k)
		}
	}
	if f.tiers {
		return f.countTiers(ctx, c)
	}
	for _, af := range f.replicas(ctx) {
		body, err := af.do(ctx, http.MethodGet, "/debug/convergence", f.query(), "")
		if final(err) {
			return c, named(af.server, err)
		}
		var dc relay.DebugConvergence
		if err == nil {
			err = json.Unmarshal(body, &dc)
		}
		if err != nil {
			c.notCounted(fmt.Sprintf("%s: %v", af.server, err))
			continue
		}
		c.answered++
		f.add(&c, af.server, dc)
	}
	return c, nil
}

// named is err, which server answered, with server's name unless err
// already says it.
func named(server string, err error) error {
	if isWrongPort(err) {
		return err
	}
	return fmt.Errorf("%s: %w", server, err)
}

func (f *waitFlags) query() url.Values {
	q := url.Values{"type": {f.typ}}
	if len(f.names) > 0 {
		q["name"] = f.names
	}
	return q
}

// add sums one replica's answer: its summary, whose clients are counted
// once each, or each resource listed, which must be all.
func (f *waitFlags) add(c *waitCount, server string, dc relay.DebugConvergence) {
	c.summed(dc)
	if !c.byResource {
		for _, s := range dc.Summary {
			c.clients.add(tally{subscribed: s.Subscribed, accepted: s.Accepted, rejected: s.Rejected, pending: s.Pending, behind: s.Behind, waiting: s.Waiting})
		}
	} else if dc.More > 0 {
		c.notCounted(fmt.Sprintf("%s: %d resources past the %d listed: name those to wait for with --name", server, dc.More, len(dc.Resources)))
	}
	for _, r := range dc.Resources {
		want := r.Version
		if f.version != "" && f.version != r.UpstreamVersion {
			// --version names the cache's version, or the upstream
			// version the current one came with.
			want = f.version
		}
		var at relay.ConvergenceVersion
		for _, v := range r.Versions {
			if v.Version == want {
				at = v
			}
		}
		behind := max(r.Subscribed-at.Accepted-at.Rejected-at.Pending, 0)
		if c.byResource {
			c.addResource(tierKey{r.Type, r.Name}, tally{subscribed: r.Subscribed, accepted: at.Accepted, rejected: at.Rejected, pending: at.Pending, behind: behind})
		}
		if at.Accepted == r.Subscribed {
			continue // there, or no client of this group holds it
		}
		if len(c.shown) == waitShown {
			c.more++
			continue
		}
		c.shown = append(c.shown, resourceLine(server, r, want, at, behind))
	}
	if !c.byResource {
		c.more += dc.More
	}
}

// summed adds a relay's clients and fleet peer streams (its summary).
func (c *waitCount) summed(dc relay.DebugConvergence) {
	for _, s := range dc.Summary {
		c.all += s.Subscribed
		c.peers += s.PeerStreams
	}
}

// resourceLine is one resource not there yet: its counts at want, and who
// rejected it and why.
func resourceLine(server string, r relay.ConvergenceResource, want string, at relay.ConvergenceVersion, behind int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s group %q %s/%s version %q: %d/%d accepted", server, r.Group, xds.ShortName(r.Type), r.Name, want, at.Accepted, r.Subscribed)
	if at.Pending > 0 {
		fmt.Fprintf(&b, ", %d pending (oldest %.1fs)", at.Pending, at.OldestPending)
	}
	if behind > 0 {
		fmt.Fprintf(&b, ", %d behind (%s)", behind, whyBehind(r, want))
	}
	if at.Rejected > 0 {
		fmt.Fprintf(&b, ", %d rejected: %q by %s", at.Rejected, at.Error, strings.Join(at.RejectedBy, ", "))
	}
	return b.String()
}

// whyBehind says why clients of r are not at want yet: the relay has it
// and has not sent it to them (a hold, or a client slow to read), or the
// relay does not have that version (yet).
func whyBehind(r relay.ConvergenceResource, want string) string {
	switch {
	case want == r.Version:
		return "the relay has it and has not sent it to them yet: a rollout or guard hold (xdsrelay rollout list, guard list), or clients slow to read"
	case want != r.UpstreamVersion && !slices.ContainsFunc(r.Versions, func(v relay.ConvergenceVersion) bool { return v.Version == want }):
		return fmt.Sprintf("the relay has no version %q of it: its version is %q", want, r.Version)
	}
	return fmt.Sprintf("at another version: the relay's is %q", r.Version)
}

// final reports whether an admin endpoint's error ends the wait at once:
// a refusal (4xx) or an xDS port, which asking again would not change.
func final(err error) bool {
	var r refusal
	return errors.As(err, &r) && r.code/100 == 4 || isWrongPort(err)
}

// replicas are the admin endpoints to ask: each --server, and each address
// of a name that resolves to several, verified as the name over TLS.
func (f *waitFlags) replicas(ctx context.Context) []adminFlags {
	var out []adminFlags
	for _, s := range f.servers {
		out = append(out, f.resolve(ctx, s)...)
	}
	return out
}

func (f *waitFlags) resolve(ctx context.Context, server string) []adminFlags {
	one := f.tls
	one.server, one.timeout = server, 10*time.Second
	scheme, hostport, hasScheme := strings.Cut(server, "://")
	if !hasScheme {
		scheme, hostport = "", server
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || net.ParseIP(host) != nil {
		return []adminFlags{one}
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil || len(addrs) < 2 || loopback(addrs) {
		return []adminFlags{one} // localhost is one relay, whether on ::1 or 127.0.0.1
	}
	out := make([]adminFlags, 0, len(addrs))
	for _, a := range addrs {
		r := one
		r.server = net.JoinHostPort(a, port)
		if scheme != "" {
			r.server = scheme + "://" + r.server
		}
		if r.files.ServerName == "" {
			r.files.ServerName = host
		}
		out = append(out, r)
	}
	return out
}

// loopback reports whether any of addrs is a loopback address.
func loopback(addrs []string) bool {
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil && ip.IsLoopback() {
			return true
		}
	}
	return false
}

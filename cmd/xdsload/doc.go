// Command xdsload is a load tool for xDS servers: a control plane, or a
// relay such as xdsrelay in front of one.
//
// It opens --clients downstream xDS clients against --target, each with one
// stream on its own gRPC connection (insecure), or --streams-per-conn N of
// them to a connection (clients i*N..i*N+N-1 share connection i: 100,000
// clients at 100 take 1,000 connections), at most --rate streams a second. Client i sends node.id "xdsload-<i>" and node.cluster
// --node-cluster, subscribes to --names of --type (wildcard when empty) with
// the --variant protocol on the aggregated service (--ads) or the per-type
// one, and ACKs every response: SotW with the response's version_info and
// nonce and the same resource_names, delta with the response's nonce. A
// client reads of each response only the nonce, the version and each
// resource's update mark (below), straight from the received bytes: the
// clients share the machine with the server measured, and decoding every
// resource in full made their garbage collector, not the server, set how
// long a change took to reach 100,000 clients.
//
// With --serve-cp it also runs the control plane: a go-control-plane server
// on that address whose cache (--cp-cache: a snapshot cache keyed by
// node.cluster, or a linear cache) holds --resources resources of --type
// (eds: ClusterLoadAssignments cla-0..cla-K-1 of --endpoints loopback
// endpoints each; cds: cluster-i; lds: listener-i; rds: route-i). Once every
// client has its first config it updates one resource every --update-every,
// --updates times, in turn over --names (or every resource). Each update
// carries its sequence number seq in the resource as B+seq (eds: in the
// port of the first endpoint; cds and lds: per_connection_buffer_limit_bytes;
// rds: max_direct_response_body_size_bytes), so a client knows when it has
// update seq, or a later one. B is drawn for each run and printed, so that
// resources a relay still holds from an earlier run are not taken for this
// run's. --target defaults to this control plane; point it at a relay in
// front of it to load the relay. --cp-protocol sotw makes it refuse delta
// with UNIMPLEMENTED, as Gloo's does, and sotw-per-type serve only the
// per-type SotW services, as Contour's does: a relay in front finds which
// (upstream.protocol: auto).
//
// With --relay it also starts xdsrelay in this process (package relay, its
// defaults but no admission limits and no bound on the streams of a
// connection unless --relay-limits, clients grouped by node.cluster, no
// admin endpoint but for --soak) in front of the --serve-cp control plane,
// and the clients load the relay.
//
// With --compare it runs five setups one after the other, with the same
// clients, resources and updates, in this process: clients through
// xdsrelay (whose upstream is a control plane with --cp-cache, linear unless
// given), directly on go-control-plane with its linear cache, with its
// snapshot cache, on the gRPC floor (grpcfloor), and the socket floor. It prints a row per setup (last
// client's fan-out latency min/p50/max over the updates, time to first
// config p50/p99, established and configured streams per second,
// connections, the server's RSS growth and goroutines per idle stream, its
// CPU per change and per client per change, and the relay's control
// plane's CPU per change) and the relay's figures divided by each other
// setup's (relay ÷ grpcfloor is what the relay adds to gRPC itself).
// --timeout then bounds each setup, and memory is returned to the system
// before each. The socket floor is skipped, and the output says so, with
// --churn and with --streams-per-conn above 1 (it has one TCP connection
// per client); the gRPC floor runs with both.
//
// With --split the server side (the control plane, the relay in front of
// it, or either floor's server) runs in a child process, this executable
// started again: the clients and the server then each have the whole
// open-file limit (10,000 clients on loopback take 10,000 descriptors on
// each side), they show up apart in top, and the RSS sampled is the
// server's alone (with --compare, each setup's server in a process of its
// own). The relay then runs in a child of its own and its control plane in
// another, so that the relay's CPU and memory are the relay's alone. With
// --cpuprofile FILE the child profiles itself into FILE.server (and its
// mutex contention into FILE.server.mutex), and writes its heap once every
// client is configured into FILE.server.heap.
//
// With --churn D it measures connect/disconnect churn instead of updates:
// for D, every client loops opening a connection (with --streams-per-conn
// above 1, a stream on a connection its group keeps), subscribing, waiting
// for the first response and closing (the stream is reset, the connection
// closed); it reports the completed cycles per second, the cycle time's
// p50 and p99, and the server's RSS (and with --split its goroutines and
// heap) before the clients, at the end of the churn, --churn-settle after
// the last client stopped, and after the server ran runtime.GC and
// debug.FreeOSMemory: whether it went back to its baseline.
//
// With --relay-limits the relay keeps its default admission limits
// (limits.stream_rate 1000/s in bursts of 10,000, max_streams, max_groups,
// max_streams_per_connection 100, ...) instead of running without them, and
// the clients retry a stream refused with RESOURCE_EXHAUSTED or UNAVAILABLE
// as Envoy does: exponential backoff from 500ms to 30s, doubling, with
// jitter (grpc-go's backoff.Config). The result reports the streams retried,
// by how many clients, and when every client was configured. With
// --relay-persist DIR the relay saves its cache in DIR (cache.persist_dir,
// every second and on shutdown) and restores it on start: a first run fills
// DIR, a second one with the same DIR measures admission after a restart
// with a warm cache, and counts the first configs that carried resources the
// run's control plane never published, which the relay served from the
// restored cache before its control plane answered. Both reach the relay's
// child with --split, and the relay's setup of --compare. --relay-group-by
// FIELDS sets the relay's upstream.group_by (default cluster: every client
// in one group); id makes each client a group, as istiod and Consul need
// (with --cp-cache linear: a snapshot cache keyed by node.cluster answers
// no group without one). Without --split, a run against the tool's own
// control plane ends with what that control plane saw: its xDS streams
// and connections once every client was configured, and the responses it
// sent for the updates.
//
// With --envoy the clients behave as Envoy does for clusters and their
// endpoints (internal/envoysim): wildcard CDS, EDS for every EDS cluster,
// and a new or changed cluster warming until its ClusterLoadAssignment
// arrives again ("Resource warming"); SotW clients repeat their last EDS
// request after every CDS response, delta clients ask for nothing when the
// names did not change. The --serve-cp control plane then serves
// --resources EDS clusters cluster-0..K-1 and their endpoints from
// go-control-plane's LinearCache, and each of --updates changes one cluster
// and not its endpoints. The clients load the control plane directly, the
// relay started with --relay, or --target (a relay started apart, whose CPU
// per change --pid samples). Each row is one change: from its publication,
// how long the changed cluster took to arrive and to be usable (p50, p99,
// max over the clients), on how many clients it was usable within a second
// of its arrival, and on how many it still warmed after
// --initial-fetch-timeout (Envoy's default, 15s), where it counts as usable
// then, as Envoy would use it on stale or no endpoints.
//
// With --soak D it soaks the relay (--relay and --serve-cp 127.0.0.1:0 are
// implied; the control plane's cache is linear unless --cp-cache says
// otherwise): once every client has its first config, for D, even clients
// speak delta and odd ones SotW, each subscribed to half the names; every
// --soak-churn-every (5s) a --soak-churn fraction (5%) of the clients
// reconnect and as many move their subscriptions by one name (delta:
// subscribe one, unsubscribe one; SotW: new resource_names); one response in
// --soak-nack-every (100) is NACKed. The control plane changes a resource
// every --update-every (2s with --soak) and every --soak-restart-every (60s,
// or a third of a shorter soak) stops serving for --soak-down (1s) and comes
// back on its address. Every --soak-every (1m; for a soak under 10m a tenth
// of it, 5s at least) it prints a row: the elapsed time, the relay's RSS and
// live heap after a forced collection (runtime.GC and debug.FreeOSMemory),
// goroutines, open fds (/proc/PID/fd), open downstream streams (the relay's
// xdsrelay_downstream_streams, from an admin endpoint on a loopback port),
// and the p50 of the update fan-out over every receipt in the interval
// (a receipt counts if the client subscribed before the change was
// published). The changes go on while the control plane is down; rows are
// taken once the last change has settled, never while it is down nor
// before the relay has its upstream streams back and every client holds
// every change, and the receipts of the changes published meanwhile are
// left out of the fan-out. At the end each figure is held to its value
// after the first 5 minutes (after the first half for a soak shorter than
// 10 minutes: the output says so). Then the changes stop, and within 90s
// every client must hold the control plane's last version of every name it
// subscribes to (checked per client and per name), and no client may have
// been told that a name it subscribes to was removed (a delta removal,
// NOT_FOUND in resource_errors, or for Listeners and Clusters a SotW
// response without it): the control plane serves every name all along, so
// any such removal is spurious. The command exits 1 unless every figure
// that --soak-gate names (all of them: rss,heap,goroutines,fds,streams,
// fanout) stayed within 10% of it and the clients ended so, or with
// --soak-report-only. Without --split the figures are this process's
// (clients, control plane and relay); with --split the relay runs in a
// child process and they are its alone. The fan-out p50 is a few
// milliseconds on loopback and moves by more than 10% from one interval to
// the next on a busy machine: gate it on a quiet one. In CI (.ci/run) a
// 20s soak gates goroutines, fds and the heap; see docs/protocol.md for
// why not RSS.
//
// With --soak-faults a TCP proxy (internal/faultproxy) sits between the
// relay and its control plane, and every --soak-restart-every the soak
// injects the next fault in turn: a control-plane restart (--soak-down),
// silence for --soak-fault-for (20s: the connections stay open and carry
// nothing), a trickle at 2 KiB/s for --soak-fault-for, and a reset of
// every connection. The relay's upstream keepalive is then 10s with a 5s
// timeout (a silent link is found dead within 15s), its connect_timeout
// 5s and its cache.not_found_timeout 5s. As each silence starts, a client
// of its own asks the relay for a name no one asked for before (the
// control plane serves it from the start): the relay cannot have it
// cached, its timer runs out during the silence, and it must not say that
// the name does not exist; the name must arrive after the silence. A row
// per fault says when it came, how long it lasted, when the relay found it
// (its xdsrelay_upstream_connected fell) and how soon after its end every
// client had every change.
//
// With --rolling it restarts two relays under load: two xdsrelay
// processes (--relay-bin, the built binary, with the production defaults
// but cache.persist_dir, saved every second) behind one address, a TCP
// balancer (internal/faultproxy) that sends each new connection to the
// next relay that accepts it, each relay reaching the tool's control plane
// (--serve-cp, 127.0.0.1:0 unless given, its linear cache unless
// --cp-cache) through a link of its own. The clients are a soak's (even
// ones delta, odd ones SotW, each subscribed to half the names), without
// churn or NACKs, --streams-per-conn to a connection. Once every client is
// configured, the control plane changes a resource every --update-every
// (1s unless given) all along, and each relay in turn, once the last
// change has settled, gets SIGTERM. Each of its streams must end after a
// GOAWAY (its client reads "received prior goaway" in the stream's status)
// and its client be answered again on a new stream; the relay must exit
// 0, and the other relay then hold every client's stream. The relay is
// started again with its link silent: a client of the tool's own, on the
// relay's own address, must get every name from it within 10s, none older
// than the relay held at SIGTERM (its saved cache, served at once); then
// the link passes, and the relay must catch up and answer /readyz; 5s
// later (as a rolling update waits for a pod to stay ready) the other
// relay is restarted, and 5s after the last one the changes stop. Then
// every client must hold the control plane's last version of every name
// it subscribes to, with no removal, as a soak's. It prints a row per
// restart, and per restart the reconnect times over its clients (min,
// p50, p90, p99, max): from a stream's end to the first response on the
// client's next stream (the client's backoff included: its first retry
// waits 500ms, ±20%), and from that stream's opening to its first
// response. It exits 1 if any check failed, and keeps the relays'
// configurations and logs then.
//
// With --fleet N it measures a fleet (docs/architecture.md, "Fleet"): N
// xdsrelay processes (--relay-bin) on loopback in front of the tool's
// control plane, which runs in a process of its own (its CPU is then its
// own) and serves --groups groups (node.cluster g0 to gG-1, 30 unless
// given) from its snapshot cache, a snapshot per group: each update is
// one group's change, the groups in turn, as a control plane changes one
// service's configuration (or, with --cp-cache linear, from one
// LinearCache for every group: each update changes a resource every group
// holds, built once and sent to each stream). The --clients, delta ADS each on a
// connection of its own, are spread over the groups and the relays; a
// client whose stream ends opens another on a relay picked at random, as
// a client behind a Service does. The same load runs twice: the relays
// apart (no fleet.peers), then as a fleet (a static fleet.peers list of
// the N). Each time, once every client is configured and the control
// plane holds the streams it should (one per group and relay apart, one
// per group as a fleet), it publishes --updates changes every
// --update-every (1s unless given), each once every client it changes has
// the one before, and reports the control plane's streams, its CPU per
// change (from /proc, over the updates), and the change-to-client latency
// of the clients each change reaches. The
// fleet's run then splits that latency between the owner's clients and the
// others (their relay draws their group from its owner: the extra hop, by
// each relay's /debug/fleet), kills relay r0 with SIGKILL and follows the
// groups it owned: the time until the control plane holds a stream of
// each again, the streams it opened until it holds one per group, and
// what the other clients were told until an update after the kill reaches
// every client (removals, resources sent again at the version held). Then
// r0 starts again, empty, and each relay's xdsrelay_fleet_clients is
// sampled every second for --balance-for (2m unless given) while the
// fleet balances. It exits 1 unless the fleet held one stream per group,
// told no client of a removal and sent none anything again, opened no
// more streams than the groups moved, and ended within the slack having
// moved no client more than twice; the CPU and the extra hop are goals it
// reports, met or missed, since a shared machine's figures vary.
//
// With --lrs it measures load reports (LRS) instead of xDS: every client
// opens one LoadReportingService stream (on its connection, or
// --streams-per-conn to one), sends its node, and reports every interval
// its first response names: one cluster, one locality, 10 requests issued
// and succeeded, one in progress. The control plane (--serve-cp, implied)
// runs a load reporting server on its port that asks every stream for
// every cluster each --lrs-interval (1s) and counts streams, reports and
// the requests they tell of. With --relay the clients report to xdsrelay
// in front of it (lrs.interval also --lrs-interval), which sends the
// group's sums on one stream; with --compare, the same clients report
// through the relay, then directly. Once every client has been told what
// to report and has reported once, it measures for --lrs-for (30s): the
// reports per second the clients sent; the CPU per report of the process
// they report to (the relay, or the control plane directly; --split for
// that process's alone); its RSS growth per stream from before the clients
// and, with --split, its heap in use (after a collection) and goroutines
// per stream; the control plane's load report streams and reports per
// second, and its CPU per second. It then stops the clients (each closes
// its side and waits for the server to end the stream) and checks that
// the control plane was told of as many requests as the clients were.
//
// With --floor it measures the socket floor instead: as many plain TCP
// connections on loopback, to which a server writes, for the initial config
// and for each update, a length-prefixed frame as large as the xDS response
// that carries it (as go-control-plane's snapshot cache builds it: SotW
// sends every subscribed resource, delta only the changed one).
//
// With --grpc-floor it measures the gRPC floor instead: the same xDS
// clients against a bare grpc-go server, with the relay's transport
// options (shared write buffer, small read and write buffers, static
// 64 KiB windows, no bound on a connection's streams), on ADS and the
// per-type service of --type, in the --variant protocol (a stream of the
// other variant, and polling, are refused as unimplemented). For the first
// config and for each update it writes every stream one response encoded
// ahead of time: the bytes the relay would send (the resources encoded
// once per update as the relay encodes them; delta and SotW EDS and RDS
// carry the changed resource, SotW LDS and CDS every subscribed one),
// behind a header with system_version_info, type_url and the stream's
// nonce, the only part assembled per stream. It keeps no cache and no
// protocol state: it reads a stream's first request to learn that it has
// subscribed, and its ACKs only to drain them; every stream gets the
// resources the clients subscribe to (--names, or all). It runs with
// --split, --churn and --streams-per-conn like a control plane.
//
// It reports, as tables on stdout (and as JSON with --json FILE):
//   - connect rate: streams established, and clients configured, per second
//     from the start to the last one;
//   - time to first config, from a client's start to its first response:
//     min, p50, p90, p99 and max over clients;
//   - update fan-out latency, from the moment the control plane publishes an
//     update to the moment the last client has it, over updates, and the
//     distribution of every client's receipt of every update; per update,
//     p50, p99 and the last client;
//   - bytes received by all clients (gRPC messages with their framing);
//   - connections dialed;
//   - with --pid PID, the server's VmRSS before the clients, once they are
//     all configured and at the end, and the growth per client ("self" is
//     this process: the --serve-cp control plane and the clients together);
//     with --split, also its goroutines: per idle stream, the growth from
//     before the clients to all configured, divided by the clients;
//   - with --pid PID, the server's CPU per change: its CPU time (utime and
//     stime from /proc/PID/stat, 10ms ticks) from just before the first
//     update to the last one delivered to every client, divided by the
//     updates, and by the clients too. With --split --relay (and in
//     --compare --split) it is the relay's alone, and its control plane's
//     is reported apart. Give enough updates that the total spans many
//     ticks.
//
// Against a server it does not serve itself (no --serve-cp), there are no
// updates to follow: the run ends once every client has its first config.
//
// A progress line goes to stderr every second. Every wait is bounded by
// --timeout: the run stops by itself, and prints what it measured so far.
//
// Flags:
//
//	--target host:port   xDS server (default: the --serve-cp control plane)
//	--clients N          clients, one xDS stream each (default 100)
//	--streams-per-conn N clients per gRPC connection (default 1; the floor needs 1)
//	--rate R             streams opened per second at most; 0: no limit (default 1000)
//	--variant delta|sotw protocol variant (default delta)
//	--ads                aggregated service; --ads=false: per-type services (default true)
//	--type eds|cds|lds|rds resource type (default eds)
//	--names a,b,c        subscriptions; empty: wildcard
//	--node-cluster name  node.cluster (default "load")
//	--pid PID|self       server process whose RSS is sampled
//	--timeout D          bound on the whole run (default 2m)
//	--serve-cp addr      serve a go-control-plane control plane and publish updates
//	--cp-cache snapshot|linear  its cache (default snapshot)
//	--resources K        resources served (default 10)
//	--endpoints E        endpoints per ClusterLoadAssignment (default 200)
//	--update-every D     pause before each update (default 500ms)
//	--updates U          updates published, with --serve-cp or a floor (default 10)
//	--churn D            connect/disconnect churn for D instead of updates
//	--churn-settle D     pause before the settled sample of a churn (default 3s)
//	--floor              measure the plain TCP socket floor instead
//	--grpc-floor         measure the gRPC floor instead
//	--relay              start xdsrelay in this process in front of --serve-cp and load it
//	--relay-limits       keep the relay's admission limits; clients retry as Envoy does
//	--relay-persist DIR  the relay's cache.persist_dir: a second run restarts warm
//	--relay-group-by F   the relay's upstream.group_by (default cluster; id: a group per client)
//	--split              server side in a child process
//	--compare            relay, linear, snapshot, gRPC floor and floor side by side
//	--lrs                load reports instead of xDS (see above)
//	--lrs-interval D     the interval the control plane asks for (default 1s)
//	--lrs-for D          how long to measure once every client reports (default 30s)
//	--soak D             soak the relay for D (see above)
//	--soak-every D       a row every D (default 1m; D/10, 5s at least, under 10m)
//	--soak-restart-every D  control-plane restarts (default 60s, or D/3)
//	--soak-down D        the control plane's downtime per restart (default 1s)
//	--soak-churn F       fraction of clients reconnecting, and resubscribing (default 0.05)
//	--soak-churn-every D how often (default 5s)
//	--soak-nack-every N  one response in N is NACKed (default 100)
//	--soak-gate a,b      figures that fail the soak (default all but fanout)
//	--soak-report-only   report the verdict, exit 0
//	--soak-faults        silence, trickle and resets too, between relay and control plane
//	--soak-fault-for D   how long a silence or a trickle lasts (default 20s)
//	--rolling            restart two relays behind one address in turn (see above)
//	--relay-bin PATH     with --rolling or --fleet, the xdsrelay executable
//	--fleet N            N relays apart, then as a fleet (see above)
//	--groups G           with --fleet, the groups the clients are spread over (default 30)
//	--balance-for D      with --fleet, how long the balance is sampled (default 2m)
//	--json FILE          also write the results as JSON
//	--cpuprofile FILE    CPU profile of this process while the updates fan out
//	                     (with --compare: FILE.relay, FILE.linear, ...), and
//	                     its mutex contention in FILE.mutex
//
// Examples, on loopback:
//
//	xdsload --serve-cp 127.0.0.1:0 --clients 200 --pid self
//	xdsload --serve-cp 127.0.0.1:18000 --target 127.0.0.1:18001 --clients 1000 --variant sotw
//	xdsload --floor --clients 200
//	xdsload --grpc-floor --split --clients 200 --names cla-0
//	xdsload --compare --clients 2000 --names cla-0 --rate 0 --update-every 2s
//	xdsload --compare --split --clients 10000 --names cla-0 --rate 0 --update-every 2s
//	xdsload --compare --split --clients 100000 --streams-per-conn 100 --names cla-0 --rate 0 --updates 3
//	xdsload --compare --split --churn 30s --clients 200 --names cla-0 --rate 0
//	xdsload --compare --split --type cds --resources 100000 --clients 4 --updates 100 --update-every 100ms
//	xdsload --compare --split --variant sotw --type cds --resources 5000 --clients 1000 --updates 10 --update-every 2s
//	xdsload --serve-cp 127.0.0.1:0 --relay --relay-limits --clients 2000 --rate 0
//	xdsload --serve-cp 127.0.0.1:0 --relay --split --relay-persist /tmp/xdsload-cache --clients 2000 --rate 0
//	xdsload --lrs --compare --split --clients 1000
//	xdsload --soak 1h --split --clients 2000
//	xdsload --soak 20s --split --clients 200 --soak-every 5s --soak-gate goroutines,fds,heap
//	xdsload --soak 30m --split --clients 2000 --soak-faults
//	xdsload --rolling --relay-bin ./xdsrelay --clients 10000 --streams-per-conn 100
//	xdsload --fleet 3 --relay-bin ./xdsrelay --clients 3000 --groups 30 --updates 20
//
// BENCHMARKS.md describes these scenarios.
package main

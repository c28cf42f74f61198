package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/policy"
	"github.com/ferryserve/ferry/proxy"
	"github.com/ferryserve/ferry/proxy/kvevents"
)

func init() { register(newProxyCmd) }

// proxyFlags are the raw flag values of `ferry proxy`; parse turns them into a proxy config.
// Kept apart from the command so that a controller-attached mode can add its flags and reuse
// the parsing.
type proxyFlags struct {
	listen          string
	name            string
	policy          string
	replicas        []string
	targetQPS       []string
	shutdownTimeout time.Duration
	drainDelay      time.Duration
	verbose         bool
	apiKeyEnvs      []string
	tlsCert         string
	tlsKey          string
	maxConcurrent   int
	maxBodyMB       int
	idleTimeout     time.Duration
	metricsListen   string
	kvEvents        string
	kvEventsPort    int
	// metricsTokenFile holds the bearer token /metrics requires; empty: none.
	metricsTokenFile string
	maxStreams       int
	maxPerReplica    int
	adapters         []string
	prefillReplicas  []string
	maxLoRAs         int
	ignoreAdapters   bool
	rateLimit        float64
	rateBurst        int
	accessLog        bool
	maxConns         int
	maxConnsPerIP    int
	maxBufferedMB    int
	// otlpEndpoint and traceSample export request spans (proxy.OTLPConfig).
	otlpEndpoint string
	traceSample  float64
	// attach is the service to follow through the controller; empty for a fixed replica list.
	attach string
	// attachAll fronts every service of the controller, routed by model (--attach-all).
	attachAll bool
	// controllers are the API URLs of several controllers, one leading (--controller).
	controllers []string
	// set tells which of attachConflicts were given on the command line.
	set map[string]bool
}

// attachConflicts are the flags whose settings an attached proxy takes from the service's YAML
// through the controller.
var attachConflicts = []string{"replica", "policy", "target-qps", "api-key-env", "name",
	"max-concurrent-requests", "max-body-mb", "idle-timeout", "max-concurrent-streams", "rate-limit", "rate-limit-burst", "max-in-flight-per-replica",
	"adapter", "max-loras", "prefill-replica"}

// proxyOptions is what the flags mean.
type proxyOptions struct {
	listen   string
	service  proxy.ServiceConfig
	backends []proxy.Backend
	// prefill are the prefill replicas of a disaggregated model (--prefill-replica).
	prefill         []proxy.Backend
	shutdownTimeout time.Duration
	// drainDelay is how long the proxy keeps accepting after SIGTERM, unready (--drain-delay).
	drainDelay time.Duration
	// metricsListen is the admin listener's address; empty serves no metrics.
	metricsListen string
	// metricsToken, when set, is the bearer token /metrics requires.
	metricsToken string
	// kvEvents, when set, is the ZeroMQ endpoint the proxy binds for the engines' KV-cache
	// events; kvEventsPort, when set, the port of every replica's own publisher it connects to
	// instead (proxy/kvevents).
	kvEvents     string
	kvEventsPort int
	accessLog    bool
	// otlp says where request spans go; off without an endpoint here or in the environment.
	otlp proxy.OTLPConfig
	// clientLimits are the process's, shared by its listeners (proxy.Guard).
	clientLimits proxy.ClientLimits
	// attach is the service followed through the controller (attach.go); service then holds
	// only what the command line sets (name, TLS) and backends is empty.
	attach string
	// attachAll fronts every service of the controller in one gateway (attach.go), as attach
	// one; service holds only TLS.
	attachAll bool
	// controllers, when set, replace FERRY_HOME's controller.json: the proxy follows whichever
	// of them leads.
	controllers []string
}

// proxyLong is `ferry proxy --help`.
const proxyLong = `Run Ferry's data plane on its own: one OpenAI-compatible endpoint that balances requests
across replicas, streams responses (SSE included), and retries a request on another replica
when a replica cannot be connected to.

With --attach SERVICE the proxy follows a service that 'ferry serve up' runs, so that several
proxies can sit behind one load balancer (a Kubernetes Service, say). It finds the controller
through FERRY_HOME: controller.json names the API's Unix socket, which a proxy on the
controller's machine uses, and its TCP address (a controller run with --listen), which a proxy
elsewhere uses, over HTTPS pinned to controller.crt off loopback. It sends the attach token in
proxy.token, which lets it follow services and report load and nothing else (the controller
token in controller.token works too). On another machine FERRY_HOME needs only copies of
controller.json, proxy.token and controller.crt. The proxy watches the service's READY replicas
with a long poll, takes the load-balancing policy, API keys and limits from the service's YAML,
and reports its load back, so that the autoscaler counts its traffic and a replica leaving is
stopped only once this proxy's requests on it have finished. If the controller goes away the
proxy keeps serving the last replica set it had, and finds a restarted controller within about a
second. Until the controller first answers, connections wait. A change of policy, keys or limits
applies to new connections; requests in flight finish under the old settings. --replica,
--policy, --target-qps, --api-key-env, --name and the limit flags do not go with --attach.
With --controller URL[,URL...] (controllers run with --leader-elect) the proxy follows whichever
of them leads instead of controller.json: a follower's 503 names the leader (X-Ferry-Leader),
tried next, and any other failure moves to the next URL; one Service URL in front of every
controller works too. It keeps serving its last replica set through a failover.
Each of N attached proxies takes 1/N of a replica's in-flight cap (the controller counts them).

With --attach-all the proxy fronts every service of the controller at once, as the controller's
own gateway does: the request body's "model" picks the service (its name, or a model id its
replicas report), and GET /v1/models lists every model. It long-polls the list of services
(names only) and follows each listed service as --attach follows one: its replicas, its policy,
keys and limits, its load reports. A service brought up later is routable within a second of
its first replica set; one taken down leaves at once (its model then gets a 404
model_not_found) while its requests in flight finish. --attach-all takes the same flags as
--attach, --controller included, and not --attach itself.

Without --attach the replica list is fixed; every replica is treated as READY. A replica is
host:port or http://host:port; append #ACCELERATOR (for example #A100) to weight it under
instance_aware_least_load with --target-qps.

--metrics-listen serves Prometheus metrics (GET /metrics), a liveness check (GET /healthz) and a
readiness check (GET /readyz: 503 until the proxy has its replicas, or when attached the
controller's first answer and first sync of managed keys, and again from SIGTERM on) on their own address, apart from traffic; keep
it on loopback or a private network, and with --metrics-token-file FILE /metrics requires
"Authorization: Bearer" and the token in FILE (a Prometheus scrape config sends it with
authorization: {credentials_file: FILE}); /healthz and /readyz stay open. With --drain-delay D
a SIGTERM first turns /readyz to 503 and keeps serving for D, so that a load balancer (a
Kubernetes Service) stops sending here before the proxy stops accepting. --access-log
writes one line per request (sampled under load: each second the first 100, then every 100th)
with its id, path, status, replica and timings, never headers, query strings or bodies.
--otlp-endpoint URL (or OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
exports a span tree per request over OTLP/HTTP: the request, its hold, each pick and attempt on
a replica with its first token, with the GenAI attributes (model, input and output tokens);
replicas get a W3C traceparent, and a client's is continued. --trace-sample samples new traces.

A request without a valid API key is refused as soon as its headers arrive, before its body
is read. --max-connections (default: half the process's file-descriptor limit) and
--max-connections-per-ip (default: a quarter of --max-connections, at least 16, so that one
idle client cannot hold every slot; -1 turns it off, right behind a load balancer) cap client
connections;
--max-buffered-body-mb caps the request bodies being read at once, by their announced length.
These hold with or without --attach.

SIGINT or SIGTERM stops accepting connections and waits up to --shutdown-timeout for requests in
flight, streams included, to finish.`

func newProxyCmd() *cobra.Command {
	var f proxyFlags
	cmd := &cobra.Command{
		Use:   "proxy",
		Short: "Run a standalone proxy for a service of the controller, or in front of fixed replicas",
		Long:  proxyLong,
		Example: `  # Follow the service "llama" of the controller in FERRY_HOME (default ~/.ferry)
  ferry serve up llama.yaml
  FERRY_HOME=~/.ferry ferry proxy --attach llama --listen 0.0.0.0:8000 --metrics-listen 127.0.0.1:9465

  # Front every service of that controller on one endpoint, routed by each request's "model"
  ferry proxy --attach-all --listen 0.0.0.0:8000 --metrics-listen 127.0.0.1:9465
  curl -s http://127.0.0.1:8000/v1/models

  # Two local vLLM servers behind one endpoint
  ferry proxy --listen 127.0.0.1:8000 --replica http://127.0.0.1:9001 --replica 127.0.0.1:9002

  # Route by what each vLLM engine reports it caches (its KV-cache events, published to
  # the proxy; each engine runs with --kv-events-config '{"enable_kv_cache_events":true,
  # "publisher":"zmq","endpoint":"tcp://127.0.0.1:5557","topic":"kv@127.0.0.1:9001@llama"}')
  ferry proxy --kv-events-listen tcp://127.0.0.1:5557 --replica 127.0.0.1:9001 --replica 127.0.0.1:9002

  # Require an API key and serve HTTPS
  FERRY_API_KEY=sk-... ferry proxy --api-key-env FERRY_API_KEY --tls-cert cert.pem --tls-key key.pem \
    --replica 127.0.0.1:9001

  # Weight replicas by GPU
  ferry proxy --policy instance_aware_least_load --target-qps A100=2 --target-qps L4=0.5 \
    --replica http://10.0.0.5:8080#A100 --replica http://10.0.0.6:8080#L4

  # Prometheus metrics on a separate admin port, and a log line per request
  ferry proxy --replica 127.0.0.1:9001 --metrics-listen 127.0.0.1:9464 --access-log
  curl -s http://127.0.0.1:9464/metrics | grep ferry_requests_total`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.set = map[string]bool{}
			for _, name := range attachConflicts {
				f.set[name] = cmd.Flags().Changed(name)
			}
			opts, err := f.parse()
			if err != nil {
				return err
			}
			log, err := newCLILogger(f.verbose)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if opts.attach != "" || opts.attachAll {
				return runAttached(ctx, opts, log)
			}
			return runProxy(ctx, opts, log)
		},
	}
	f.define(cmd.Flags())
	return cmd
}

// define declares the flags of `ferry proxy` on fl.
func (f *proxyFlags) define(fl *pflag.FlagSet) {
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8000", "address to serve on, host:port")
	fl.StringVar(&f.name, "name", "default", "service name, shown in errors and logs")
	fl.StringVar(&f.policy, "policy", policy.Default, "load balancing policy: "+strings.Join(policy.Names(), ", "))
	fl.StringArrayVar(&f.replicas, "replica", nil, "replica address, host:port or http://host:port[#ACCELERATOR] (repeatable; required without --attach)")
	fl.StringArrayVar(&f.prefillReplicas, "prefill-replica", nil, "a prefill replica of a disaggregated model, host:port (repeatable): each completion is prefilled there (vLLM's kv_transfer_params, do_remote_decode), then decoded on a --replica with the KV it pulls")
	fl.StringArrayVar(&f.targetQPS, "target-qps", nil, "target QPS per replica of an accelerator, ACCELERATOR=QPS (repeatable)")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", time.Minute, "how long to wait for in-flight requests on SIGINT/SIGTERM")
	fl.DurationVar(&f.drainDelay, "drain-delay", 0, "on SIGINT/SIGTERM, first answer 503 on /readyz and keep accepting for this long, so a load balancer stops sending here before the proxy stops accepting (Kubernetes: a few seconds)")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "log at debug level")
	fl.StringArrayVar(&f.apiKeyEnvs, "api-key-env", nil, "require an API key: the name of an environment variable holding one (repeatable)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "serve HTTPS with this PEM certificate (needs --tls-key)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "PEM private key for --tls-cert")
	fl.IntVar(&f.maxConcurrent, "max-concurrent-requests", 0, "answer 429 beyond this many requests in flight (0: no cap)")
	fl.IntVar(&f.maxStreams, "max-concurrent-streams", 0, "answer 429 to streaming requests beyond this many streams in flight (0: no cap)")
	fl.IntVar(&f.maxPerReplica, "max-in-flight-per-replica", 0, "hold requests in the proxy beyond this many in flight on every replica, and send each to the first replica that frees a slot (0: each replica's batch size, learned from its vLLM or TGI metrics; -1: off)")
	fl.StringArrayVar(&f.adapters, "adapter", nil, "a LoRA adapter requests may name as their model (repeatable); the proxy also learns adapters from the replicas' /v1/models and vllm:lora_requests_info")
	fl.IntVar(&f.maxLoRAs, "max-loras", 0, "adapters a replica runs at once when its engine does not report max_lora (vLLM's --max-loras; 0: vLLM's default, 1)")
	fl.BoolVar(&f.ignoreAdapters, "ignore-adapters", false, "route requests as if they named no LoRA adapter (to measure what adapter-aware routing brings)")
	fl.Float64Var(&f.rateLimit, "rate-limit", 0, "requests per second allowed per API key (per client address without keys); beyond it 429 (0: no limit)")
	fl.IntVar(&f.rateBurst, "rate-limit-burst", 0, "requests a key may send at once under --rate-limit (default: one second's worth)")
	fl.IntVar(&f.maxBodyMB, "max-body-mb", proxy.DefaultMaxRequestBodySize>>20, "largest request body accepted, in MiB")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", proxy.DefaultIdleTimeout, "how long a replica or client may stay silent mid-request")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "serve Prometheus /metrics, /healthz and /readyz on this address, host:port (default: off)")
	fl.StringVar(&f.kvEvents, "kv-events-listen", "", "bind this ZeroMQ endpoint, tcp://HOST:PORT, for the replicas' vLLM KV-cache events (--kv-events-config with \"endpoint\": \"tcp://THIS:PORT\", \"topic\": \"kv@REPLICA_HOST:REPLICA_PORT@MODEL\"); least_ttft then matches prompts' token ids, from the replicas' /tokenize, against what each engine reports it holds (default: off)")
	fl.IntVar(&f.kvEventsPort, "kv-events-connect", 0, "connect to this port on every replica's host for its vLLM KV-cache events, where each engine's publisher binds (vLLM's default, --kv-events-config '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\"}' binds tcp://*:5557); unlike --kv-events-listen, any number of proxies can hear one engine (default: off)")
	fl.StringVar(&f.metricsTokenFile, "metrics-token-file", "", "require this file's token as \"Authorization: Bearer\" on /metrics (/healthz stays open)")
	fl.BoolVar(&f.accessLog, "access-log", false, "log one line per request (sampled under load)")
	fl.IntVar(&f.maxConns, "max-connections", 0, "refuse client connections beyond this many open at once, with 503 (0: half the process's file-descriptor limit)")
	fl.IntVar(&f.maxBufferedMB, "max-buffered-body-mb", proxy.DefaultMaxBufferedBodyBytes>>20, "request bodies being read at once, in MiB by their announced length; beyond it 503 at the request's headers")
	fl.IntVar(&f.maxConnsPerIP, "max-connections-per-ip", 0, "refuse a client address's connections beyond this many open at once, with 429 (0: a quarter of --max-connections, at least 16; -1: no cap, right behind a load balancer)")
	fl.StringVar(&f.otlpEndpoint, "otlp-endpoint", "", "export a span tree per request to this OTLP/HTTP collector, http(s)://HOST:PORT[/PATH] (/v1/traces added to a bare host); default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else off")
	fl.Float64Var(&f.traceSample, "trace-sample", 1, "share of new traces recorded when tracing is on, in (0, 1] (0 means 1); a client's traceparent decides for its own")
	fl.StringVar(&f.attach, "attach", "", "follow this service of the controller in FERRY_HOME instead of fixed replicas")
	fl.BoolVar(&f.attachAll, "attach-all", false, "front every service of the controller in FERRY_HOME on one endpoint, each request routed by its \"model\" (a gateway), instead of fixed replicas")
	fl.StringSliceVar(&f.controllers, "controller", nil, "with --attach or --attach-all: the API URLs of the controllers (http(s)://HOST:PORT, comma-separated or repeated) when several run with --leader-elect; the proxy follows whichever leads, with FERRY_HOME's proxy.token (and controller.crt for https)")
}

// parse validates the flags and reports every problem at once.
func (f proxyFlags) parse() (proxyOptions, error) {
	opts := proxyOptions{
		listen:          f.listen,
		shutdownTimeout: f.shutdownTimeout,
		drainDelay:      f.drainDelay,
		service:         proxy.ServiceConfig{Name: f.name, Policy: f.policy},
		metricsListen:   f.metricsListen,
		kvEvents:        f.kvEvents,
		kvEventsPort:    f.kvEventsPort,
		accessLog:       f.accessLog,
		otlp:            proxy.OTLPConfig{Endpoint: f.otlpEndpoint, SampleRatio: f.traceSample, ServiceName: "ferry-proxy"},
	}
	errs := f.parseServing(&opts)
	if err := opts.otlp.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--otlp-endpoint, --trace-sample: %w", err))
	}
	for _, u := range f.controllers {
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			errs = append(errs, fmt.Errorf("--controller %q: want http://HOST:PORT or https://HOST:PORT", u))
		}
	}
	if len(f.controllers) > 0 && f.attach == "" && !f.attachAll {
		errs = append(errs, errors.New("--controller goes with --attach or --attach-all"))
	}
	if f.attach != "" && f.attachAll {
		errs = append(errs, errors.New("--attach and --attach-all: one service or every service, not both"))
	}
	if f.attach != "" || f.attachAll {
		return opts.attached(f, errs)
	}
	errs = append(errs, f.parseReplicas(&opts)...)
	errs = append(errs, f.parseRouting(&opts)...)
	errs = append(errs, f.parseKeys(&opts)...)
	errs = append(errs, f.parseLimits(&opts)...)
	return opts, errors.Join(errs...)
}

// parseServing checks how the proxy serves, with or without --attach: its listeners, the
// metrics token, the shutdown timeout and TLS.
func (f proxyFlags) parseServing(opts *proxyOptions) []error {
	var errs []error
	if f.metricsTokenFile != "" {
		if f.metricsListen == "" {
			errs = append(errs, errors.New("--metrics-token-file: goes with --metrics-listen"))
		} else if tok, err := readTokenFile(f.metricsTokenFile); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-token-file: %w", err))
		} else {
			opts.metricsToken = tok
		}
	}
	if _, _, err := net.SplitHostPort(f.listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: %w", f.listen, err))
	}
	if rest, ok := strings.CutPrefix(f.kvEvents, "tcp://"); f.kvEvents != "" {
		if _, _, err := net.SplitHostPort(rest); !ok || err != nil {
			errs = append(errs, fmt.Errorf("--kv-events-listen %q: want tcp://HOST:PORT", f.kvEvents))
		}
	}
	if f.kvEventsPort < 0 || f.kvEventsPort > 65535 || f.kvEventsPort > 0 && f.kvEvents != "" {
		errs = append(errs, fmt.Errorf("--kv-events-connect %d: want a port, 1-65535, and not with --kv-events-listen", f.kvEventsPort))
	}
	if f.metricsListen != "" {
		if _, port, err := net.SplitHostPort(f.metricsListen); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-listen %q: %w", f.metricsListen, err))
		} else if f.metricsListen == f.listen && port != "0" {
			errs = append(errs, fmt.Errorf("--metrics-listen %q: must differ from --listen", f.metricsListen))
		}
	}
	if f.shutdownTimeout < 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout %v: must not be negative", f.shutdownTimeout))
	}
	if f.drainDelay < 0 || f.drainDelay > 5*time.Minute {
		errs = append(errs, fmt.Errorf("--drain-delay %v: must be between 0 and 5m", f.drainDelay))
	}
	errs = append(errs, f.parseClientLimits(opts)...)
	if (f.tlsCert == "") != (f.tlsKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	} else if f.tlsCert != "" {
		cfg, err := proxy.LoadTLS(f.tlsCert, f.tlsKey)
		if err != nil {
			errs = append(errs, err)
		}
		opts.service.TLS = cfg
	}
	return errs
}

// maxBufferedBodyMB bounds --max-buffered-body-mb: 1 TiB is far beyond any machine's memory.
const maxBufferedBodyMB = 1 << 20

// parseClientLimits checks the process-wide caps on clients, which hold with or without --attach.
func (f proxyFlags) parseClientLimits(opts *proxyOptions) []error {
	var errs []error
	if f.maxConns < 0 {
		errs = append(errs, fmt.Errorf("--max-connections %d: must not be negative", f.maxConns))
	}
	if f.maxConnsPerIP < proxy.NoConnectionCapPerAddr {
		errs = append(errs, fmt.Errorf("--max-connections-per-ip %d: want a positive cap, 0 (the default) or -1 (no cap)", f.maxConnsPerIP))
	}
	if f.maxBufferedMB < 0 || f.maxBufferedMB > maxBufferedBodyMB {
		errs = append(errs, fmt.Errorf("--max-buffered-body-mb %d: want 1 to %d (0: the default)", f.maxBufferedMB, maxBufferedBodyMB))
	}
	opts.clientLimits = proxy.ClientLimits{MaxConnections: f.maxConns, MaxConnectionsPerAddr: f.maxConnsPerIP,
		MaxBufferedBodyBytes: int64(f.maxBufferedMB) << 20}
	return errs
}

// parseReplicas turns the fixed --replica list into backends.
func (f proxyFlags) parseReplicas(opts *proxyOptions) []error {
	var errs []error
	if len(f.replicas) == 0 {
		errs = append(errs, errors.New("--replica: at least one is required"))
	}
	seen := map[string]bool{}
	for i, raw := range f.replicas {
		addr, accelerator, err := parseReplica(raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("--replica %q: %w", raw, err))
			continue
		}
		if seen[addr] {
			errs = append(errs, fmt.Errorf("--replica %q: address %s given twice", raw, addr))
			continue
		}
		seen[addr] = true
		opts.backends = append(opts.backends, proxy.Backend{ID: i + 1, Addr: addr, Accelerator: accelerator, Version: 1})
	}
	for i, raw := range f.prefillReplicas {
		addr, accelerator, err := parseReplica(raw)
		if err == nil && seen[addr] {
			err = fmt.Errorf("address %s given twice", addr)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--prefill-replica %q: %w", raw, err))
			continue
		}
		seen[addr] = true
		opts.prefill = append(opts.prefill, proxy.Backend{ID: len(f.replicas) + i + 1, Addr: addr, Accelerator: accelerator, Version: 1})
	}
	return errs
}

// parseRouting checks the load-balancing policy and its per-accelerator targets.
func (f proxyFlags) parseRouting(opts *proxyOptions) []error {
	var errs []error
	for _, raw := range f.targetQPS {
		accelerator, value, ok := strings.Cut(raw, "=")
		qps, err := strconv.ParseFloat(value, 64)
		if !ok || accelerator == "" || err != nil || !(qps > 0) {
			errs = append(errs, fmt.Errorf("--target-qps %q: want ACCELERATOR=QPS with a positive QPS", raw))
			continue
		}
		if opts.service.TargetQPSPerAccelerator == nil {
			opts.service.TargetQPSPerAccelerator = map[string]float64{}
		}
		opts.service.TargetQPSPerAccelerator[accelerator] = qps
	}
	if _, err := policy.New(f.policy, policy.Options{TargetQPSPerAccelerator: opts.service.TargetQPSPerAccelerator}); err != nil {
		errs = append(errs, fmt.Errorf("--policy: %w", err))
	}
	return errs
}

// parseKeys reads the API keys from the environment; the proxy keeps only their hashes.
func (f proxyFlags) parseKeys(opts *proxyOptions) []error {
	var errs []error
	for _, name := range f.apiKeyEnvs {
		key := os.Getenv(name)
		switch {
		case key == "":
			errs = append(errs, fmt.Errorf("--api-key-env %s: the variable is not set", name))
		case len(key) < configs.MinAPIKeyLength:
			errs = append(errs, fmt.Errorf("--api-key-env %s: the key is %d characters; API keys must be at least %d", name, len(key), configs.MinAPIKeyLength))
		default:
			opts.service.APIKeyHashes = append(opts.service.APIKeyHashes, configs.HashAPIKey(key))
		}
	}
	return errs
}

// parseLimits checks the request, stream, per-replica and rate limits.
func (f proxyFlags) parseLimits(opts *proxyOptions) []error {
	var errs []error
	if f.maxConcurrent < 0 {
		errs = append(errs, fmt.Errorf("--max-concurrent-requests %d: must not be negative", f.maxConcurrent))
	}
	opts.service.MaxConcurrentRequests = f.maxConcurrent
	if f.maxBodyMB < 1 || f.maxBodyMB > configs.MaxRequestBodyMB {
		errs = append(errs, fmt.Errorf("--max-body-mb %d: want 1 to %d", f.maxBodyMB, configs.MaxRequestBodyMB))
	}
	opts.service.MaxRequestBodySize = f.maxBodyMB << 20
	if f.idleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--idle-timeout %v: must be positive", f.idleTimeout))
	}
	opts.service.IdleTimeout = f.idleTimeout
	if f.maxStreams < 0 {
		errs = append(errs, fmt.Errorf("--max-concurrent-streams %d: must not be negative", f.maxStreams))
	}
	opts.service.MaxConcurrentStreams = f.maxStreams
	if f.maxPerReplica < -1 {
		errs = append(errs, fmt.Errorf("--max-in-flight-per-replica %d: want a positive cap, 0 (learn each replica's batch size) or -1 (off)", f.maxPerReplica))
	}
	opts.service.MaxInFlightPerReplica = f.maxPerReplica
	if f.maxLoRAs < 0 || f.maxLoRAs > 1024 {
		errs = append(errs, fmt.Errorf("--max-loras %d: want 1 to 1024, or 0 for vLLM's default", f.maxLoRAs))
	}
	opts.service.Adapters, opts.service.MaxLoRAs, opts.service.IgnoreAdapters = f.adapters, f.maxLoRAs, f.ignoreAdapters
	switch {
	case f.rateLimit < 0 || f.rateLimit > configs.MaxRateLimit || f.rateLimit > 0 && f.rateLimit < configs.MinRateLimitRPS:
		errs = append(errs, fmt.Errorf("--rate-limit %g: want 0 (off) or %g to %d requests per second", f.rateLimit, configs.MinRateLimitRPS, configs.MaxRateLimit))
	case f.rateBurst < 0 || f.rateBurst > configs.MaxRateLimit:
		errs = append(errs, fmt.Errorf("--rate-limit-burst %d: want 1 to %d", f.rateBurst, configs.MaxRateLimit))
	case f.rateBurst > 0 && f.rateLimit == 0:
		errs = append(errs, errors.New("--rate-limit-burst: goes with --rate-limit"))
	}
	opts.service.RateLimit = proxy.RateLimit{RequestsPerSecond: f.rateLimit, Burst: f.rateBurst}
	return errs
}

// attached finishes parse for --attach and --attach-all: the service's name, and no flag whose
// setting comes from the services' YAML.
func (opts proxyOptions) attached(f proxyFlags, errs []error) (proxyOptions, error) {
	opts.attach, opts.attachAll = f.attach, f.attachAll
	opts.controllers = f.controllers
	opts.service = proxy.ServiceConfig{Name: f.attach, TLS: opts.service.TLS}
	mode := "--attach"
	if f.attachAll {
		// Each service's proxy is named for it; this name is only the base's.
		opts.service.Name, mode = "gateway", "--attach-all"
	}
	given := map[string]bool{"replica": len(f.replicas) > 0, "target-qps": len(f.targetQPS) > 0, "api-key-env": len(f.apiKeyEnvs) > 0}
	for _, name := range attachConflicts {
		if f.set[name] || given[name] {
			errs = append(errs, fmt.Errorf("--%s does not go with %s: an attached proxy gets this from the controller", name, mode))
		}
	}
	return opts, errors.Join(errs...)
}

// parseReplica accepts host:port or http://host:port, optionally followed by #ACCELERATOR.
func parseReplica(raw string) (addr, accelerator string, err error) {
	rest, accelerator, _ := strings.Cut(raw, "#")
	if strings.Contains(rest, "://") {
		u, err := url.Parse(rest)
		if err != nil {
			return "", "", err
		}
		if u.Scheme != "http" {
			return "", "", fmt.Errorf("scheme %q: only http replicas are supported", u.Scheme)
		}
		if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
			return "", "", errors.New("want only a scheme, host and port")
		}
		rest = u.Host
		if u.Port() == "" {
			rest = net.JoinHostPort(u.Hostname(), "80")
		}
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", "", err
	}
	if host == "" || port == "" {
		return "", "", errors.New("want host:port")
	}
	return net.JoinHostPort(host, port), accelerator, nil
}

// runProxy binds the traffic and admin listeners, then serves until ctx ends and drains.
func runProxy(ctx context.Context, opts proxyOptions, log *zap.Logger) error {
	ln, adminLn, err := bindProxyListeners(opts)
	if err != nil {
		return err
	}
	return serveProxy(ctx, opts, ln, adminLn, log)
}

// bindProxyListeners binds the traffic listener and, with --metrics-listen, the admin one
// (nil without).
func bindProxyListeners(opts proxyOptions) (ln, adminLn net.Listener, err error) {
	ln, err = net.Listen("tcp", opts.listen)
	if err != nil {
		return nil, nil, err
	}
	if opts.metricsListen != "" {
		if adminLn, err = net.Listen("tcp", opts.metricsListen); err != nil {
			ln.Close()
			return nil, nil, fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	return ln, adminLn, nil
}

// serveProxy serves traffic on ln, and metrics on adminLn unless it is nil, until ctx ends;
// then it drains requests in flight. It closes both listeners.
func serveProxy(ctx context.Context, opts proxyOptions, ln, adminLn net.Listener, log *zap.Logger) error {
	ready := new(proxy.Readiness)
	base, stopAdmin, err := proxyBaseConfig(opts, adminLn, ready, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer stopAdmin()
	opts.service = base
	svc, err := proxy.NewService(opts.service)
	if err != nil {
		ln.Close()
		return err
	}
	svc.SetBackends(opts.backends)
	if err := svc.SetPrefillBackends(opts.prefill); err != nil {
		return err
	}
	log.Info("proxy serving", zap.String("service", opts.service.Name), zap.String("endpoint", "http://"+ln.Addr().String()),
		zap.String("policy", opts.service.Policy), zap.Int("replicas", len(opts.backends)))

	served := make(chan error, 1)
	go func() { served <- svc.Serve(ln) }()
	ready.Ready()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	if err := ready.DrainFor(opts.drainDelay, svc, served, log); err != nil {
		return err
	}
	log.Info("shutting down: draining requests in flight", zap.Int64("in_flight", svc.InFlight()), zap.Duration("timeout", opts.shutdownTimeout))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), opts.shutdownTimeout)
	defer cancel()
	if err := svc.Shutdown(shutdownCtx); err != nil {
		return err
	}
	return <-served
}

// proxyBaseConfig is the part of a service's proxy configuration that comes from the command
// line: name, TLS, the process's client limits, logs, metrics (served on adminLn unless it is
// nil) and the engines' KV-cache events. stop ends the admin listener and the events' socket.
func proxyBaseConfig(opts proxyOptions, adminLn net.Listener, ready *proxy.Readiness, log *zap.Logger) (cfg proxy.ServiceConfig, stop func(), err error) {
	cfg = opts.service
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
			if adminLn != nil {
				adminLn.Close()
			}
		}
	}()
	if cfg.Guard, err = proxy.NewGuard(opts.clientLimits); err != nil {
		return cfg, nil, err
	}
	cfg.Logger = log
	if opts.accessLog {
		cfg.AccessLog = log.Named("access")
	}
	if cfg.Tracing, err = startTracing(opts.otlp, log); err != nil {
		return cfg, nil, err
	}
	stops = append(stops, func() { flushTracing(cfg.Tracing, log) })
	events, err := kvevents.Open(opts.kvEvents, opts.kvEventsPort, log.Named("kvevents"))
	if err != nil {
		return cfg, nil, err
	}
	if events != nil {
		cfg.KVEvents = events
		stops = append(stops, func() { events.Close() })
		log.Info("hearing the replicas' KV-cache events: " + events.Describe())
	}
	if adminLn == nil {
		return cfg, stop, nil
	}
	reg, metrics, err := proxy.NewRegistry()
	if err != nil {
		return cfg, nil, err
	}
	if events != nil {
		for _, c := range events.Collectors() {
			if err = reg.Register(c); err != nil {
				return cfg, nil, err
			}
		}
	}
	cfg.Metrics = metrics
	stopAdmin := proxy.ServeAdmin(adminLn, reg, opts.metricsToken, ready, log.Named("metrics"))
	log.Info("metrics serving", zap.String("endpoint", "http://"+adminLn.Addr().String()+"/metrics"), zap.Bool("token_required", opts.metricsToken != ""))
	// Metrics stay up while requests drain; a scrape still running at exit is cut off.
	stops = append(stops, func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		stopAdmin(ctx)
	})
	return cfg, stop, nil
}

// startTracing starts exporting request spans when otlp names a collector; nil when not.
func startTracing(otlp proxy.OTLPConfig, log *zap.Logger) (*proxy.Tracing, error) {
	tr, err := proxy.StartOTLP(context.Background(), otlp)
	if err != nil {
		return nil, err
	}
	if tr != nil {
		log.Info("exporting request traces over OTLP", zap.String("endpoint", otlp.Endpoint), zap.Float64("sample", otlp.SampleRatio))
	}
	return tr, nil
}

// flushTracing sends the spans still buffered, within 5 s; the services have drained by then.
func flushTracing(tr *proxy.Tracing, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		log.Warn("flushing request traces", zap.Error(err))
	}
}

// newCLILogger logs human-readable lines to stderr.
func newCLILogger(verbose bool) (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	cfg.Encoding = "console"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.Sampling = nil
	if verbose {
		cfg.Level = zap.NewAtomicLevelAt(zap.DebugLevel)
	}
	return cfg.Build()
}

// readTokenFile reads a bearer token from a file, as Prometheus reads credentials_file: the
// whole file, surrounding whitespace trimmed. Errors never show the file's contents.
func readTokenFile(path string) (string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if info.Size() > 4<<10 {
		return "", fmt.Errorf("%s is %d bytes; a token file holds one token", path, info.Size())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case len(tok) < proxy.MinAdminTokenLength:
		return "", fmt.Errorf("the token in %s is %d characters; want at least %d", path, len(tok), proxy.MinAdminTokenLength)
	case strings.ContainsAny(tok, " \t\r\n"):
		return "", fmt.Errorf("the token in %s contains whitespace; the file holds one token", path)
	}
	return tok, nil
}

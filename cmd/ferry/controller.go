package main

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/ferryserve/ferry/internal/controller"
	"github.com/ferryserve/ferry/internal/home"
	kubelauncher "github.com/ferryserve/ferry/launcher/kubernetes"
	"github.com/ferryserve/ferry/replicas"
)

func init() { register(newControllerCmd) }

// controllerLong is `ferry controller --help`.
const controllerLong = `Run Ferry's controller: it owns all state (SQLite under $FERRY_HOME, default ~/.ferry),
launches and probes replicas, serves each service's endpoint, and answers the CLI on the Unix
socket $FERRY_HOME/controller.sock (0600) with the token in $FERRY_HOME/controller.token. With
--listen it serves the same API on a TCP address too, for attached proxies on other machines:
over HTTPS with --api-tls-cert and --api-tls-key, which an address off loopback requires (the
certificate is copied to $FERRY_HOME/controller.crt, which clients pin).
Prometheus metrics for every service
are served apart from traffic on --metrics-addr (/metrics and /healthz; with
--metrics-token-file, /metrics requires that file's token as a bearer token, which a Prometheus
scrape config sends with authorization: {credentials_file: FILE}), and requests are logged,
sampled under load, as lines of the logger "access".

With --store kubernetes --leader-elect several controllers share their state in the API server and
elect a leader on a Lease; the others follow (forwarding the API to the leader, launching nothing)
and one takes over within about 10 s of the leader's death (docs/kubernetes.md, High availability).
Every Kubernetes client the controller makes is rate-limited client-side by --kube-api-qps and
--kube-api-burst, each with its own budget; the defaults are sized for 1,000 replicas.

In a cluster whose attached gateway proxies (ferry proxy --attach-all) sit behind one Service,
--service-endpoints-via names that Service: every FerryService then gets a Service of its own
name leading to the proxies, and its status.endpoint is http://NAME.NAMESPACE.svc:PORT; with
--service-httproute-parent and --service-httproute-hostname, a Gateway API HTTPRoute too
(docs/kubernetes.md, "An endpoint per FerryService"). The Helm chart sets them.

Every other command starts it in the background when it is not running, so you rarely run this.`

// controllerFlags are `ferry controller`'s settings, from its flags and environment.
type controllerFlags struct {
	opts             controller.Options
	logLevel         string
	metricsTokenFile string
	envErrs          []error // settings in the environment that do not parse
	bufferedMB       int
	election         electionFlags
}

func newControllerCmd() *cobra.Command {
	var cf controllerFlags
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller daemon in the foreground (the CLI starts it for you)",
		Long:  controllerLong,
		Example: "  ferry controller                 # foreground, logs to the terminal\n" +
			"  ferry controller --metrics-addr 127.0.0.1:9500   # Prometheus metrics on another port\n" +
			"  ferry controller --listen 10.0.0.5:7443 --api-tls-cert api.crt --api-tls-key api.key   # for proxies elsewhere\n" +
			"  ferry controller --store kubernetes --kube-api-qps 400 --kube-api-burst 800   # a larger fleet's client-side API rate limit\n" +
			"  ferry controller --store kubernetes --service-endpoints-via ferry-proxy:80   # each FerryService reachable at http://NAME.NAMESPACE.svc:80\n" +
			"  ferry controller --store kubernetes --service-endpoints-via ferry-proxy:80 \\\n" +
			"      --service-httproute-parent name=public,namespace=gateways --service-httproute-hostname '{name}.llm.example.com'   # and an HTTPRoute each\n" +
			"  ferry controller status\n  ferry controller stop",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cf.run(cmd) },
	}
	cf.register(cmd.Flags())
	cmd.AddCommand(newControllerStatusCmd(), newControllerStopCmd())
	return cmd
}

// run starts the controller in the foreground until SIGINT or SIGTERM.
func (cf *controllerFlags) run(cmd *cobra.Command) error {
	opts := &cf.opts
	if err := errors.Join(append(cf.envErrs, opts.Store.Validate(), opts.Endpoints.Validate())...); err != nil {
		return err
	}
	h, err := home.Default()
	if err != nil {
		return err
	}
	log, err := newLogger(cf.logLevel)
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck
	if cf.metricsTokenFile != "" {
		if opts.MetricsToken, err = readTokenFile(cf.metricsTokenFile); err != nil {
			return fmt.Errorf("--metrics-token-file: %w", err)
		}
	}
	opts.ClientLimits.MaxBufferedBodyBytes = int64(cf.bufferedMB) << 20
	opts.OTLP.ServiceName = "ferry-controller"
	if err := opts.OTLP.Validate(); err != nil {
		return fmt.Errorf("--otlp-endpoint, --trace-sample: %w", err)
	}
	opts.Home = h
	opts.Version = version()
	opts.Logger = log
	opts.PathPrepend = binDir()
	opts.Supervisor, _ = os.Executable() // "" runs fixed-port replicas unsupervised
	if err := cf.election.apply(opts, log); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = controller.New(*opts).Start(ctx)
	if errors.Is(err, controller.ErrAlreadyRunning) {
		return fmt.Errorf("%w (%s)", err, h.Dir)
	}
	return err
}

// register binds every setting to f, each flag's default from its environment variable.
func (cf *controllerFlags) register(f *pflag.FlagSet) {
	opts, envErrs := &cf.opts, &cf.envErrs
	f.StringVar(&opts.Listen, "listen", envOr("FERRY_CONTROLLER_LISTEN", ""),
		"also serve the API on this TCP address, host:port, for attached proxies on other machines; the CLI uses the socket in FERRY_HOME ($FERRY_CONTROLLER_LISTEN)")
	f.StringVar(&opts.APITLSCert, "api-tls-cert", os.Getenv("FERRY_CONTROLLER_TLS_CERT"),
		"serve --listen over HTTPS with this certificate (PEM); required off loopback ($FERRY_CONTROLLER_TLS_CERT)")
	f.StringVar(&opts.APITLSKey, "api-tls-key", os.Getenv("FERRY_CONTROLLER_TLS_KEY"),
		"the key of --api-tls-cert (PEM) ($FERRY_CONTROLLER_TLS_KEY)")
	f.StringVar(&opts.ProxyHost, "proxy-host", "127.0.0.1", "address service endpoints listen on (0.0.0.0 to expose them)")
	f.IntVar(&opts.FirstServicePort, "first-service-port", 30001, "lowest port a service endpoint gets")
	f.DurationVar(&opts.ProbeInterval, "probe-interval", 2*time.Second, "how often replicas' readiness probes run")
	f.DurationVar(&opts.DrainTimeout, "drain-timeout", replicas.DefaultDrainTimeout, "how long a replica leaving (scale-down, update, serve down) may finish its in-flight requests and streams")
	f.StringVar(&opts.LogFile, "log-file", "", "file this controller's output goes to (for 'serve logs --controller')")
	f.StringVar(&cf.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&opts.GatewayAddr, "gateway", envOr("FERRY_GATEWAY_ADDR", controller.DefaultGatewayAddr),
		"shared endpoint that routes by the request's model, host:port; empty or \"off\" to disable ($FERRY_GATEWAY_ADDR)")
	f.StringVar(&opts.MetricsAddr, "metrics-addr", envOr("FERRY_METRICS_ADDR", controller.DefaultMetricsAddr),
		"admin listener for Prometheus /metrics and /healthz, host:port; empty or \"off\" to disable ($FERRY_METRICS_ADDR)")
	f.StringVar(&opts.OTLP.Endpoint, "otlp-endpoint", "",
		"export a span tree per request of every service and the gateway to this OTLP/HTTP collector, http(s)://HOST:PORT[/PATH]; default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or $OTEL_EXPORTER_OTLP_ENDPOINT, else off")
	f.Float64Var(&opts.OTLP.SampleRatio, "trace-sample", 1, "share of new traces recorded when tracing is on, in (0, 1] (0 means 1)")
	f.StringVar(&opts.KVEventsAddr, "kv-events-listen", os.Getenv("FERRY_KV_EVENTS_ADDR"),
		"bind this ZeroMQ endpoint, tcp://HOST:PORT, for replicas' vLLM KV-cache events (--kv-events-config with \"endpoint\" this address and \"topic\": \"kv@$FERRY_HOST:$FERRY_PORT@MODEL\"); every service's least_ttft then routes by what each engine reports it caches ($FERRY_KV_EVENTS_ADDR)")
	f.IntVar(&opts.KVEventsPort, "kv-events-connect", envInt("FERRY_KV_EVENTS_PORT", envErrs),
		"connect to this port on every replica's host for its vLLM KV-cache events, where each engine's publisher binds (vLLM's default binds tcp://*:5557); instead of --kv-events-listen ($FERRY_KV_EVENTS_PORT)")
	f.StringVar(&cf.metricsTokenFile, "metrics-token-file", os.Getenv("FERRY_METRICS_TOKEN_FILE"),
		"require the token in this file as \"Authorization: Bearer\" on /metrics; /healthz stays open ($FERRY_METRICS_TOKEN_FILE)")
	f.IntVar(&opts.ClientLimits.MaxConnections, "max-connections", envInt("FERRY_MAX_CONNECTIONS", envErrs),
		"refuse client connections beyond this many open at once over every service endpoint and the gateway, with 503 (0: half the file-descriptor limit; $FERRY_MAX_CONNECTIONS)")
	f.IntVar(&opts.ClientLimits.MaxConnectionsPerAddr, "max-connections-per-ip", envInt("FERRY_MAX_CONNECTIONS_PER_IP", envErrs),
		"refuse a client address's connections beyond this many open at once, with 429 (0: a quarter of --max-connections, at least 16; -1: no cap, right behind a load balancer; $FERRY_MAX_CONNECTIONS_PER_IP)")
	f.IntVar(&cf.bufferedMB, "max-buffered-body-mb", envInt("FERRY_MAX_BUFFERED_BODY_MB", envErrs),
		"request bodies being read at once, in MiB by their announced length; beyond it 503 at the request's headers (0: 512; $FERRY_MAX_BUFFERED_BODY_MB)")
	f.DurationVar(&opts.JobRetryInterval, "job-retry-interval", envDuration("FERRY_JOB_RETRY_INTERVAL", envErrs),
		"how often jobs waiting for capacity try to launch again (0: 15s; $FERRY_JOB_RETRY_INTERVAL)")
	f.DurationVar(&opts.PreemptionCooldown, "preemption-cooldown", envDuration("FERRY_PREEMPTION_COOLDOWN", envErrs),
		"how long a job preempted for a higher-priority job or a local replica is safe from another preemption (0: 5m; $FERRY_PREEMPTION_COOLDOWN)")
	f.DurationVar(&opts.JobWatchInterval, "job-watch-interval", envDuration("FERRY_JOB_WATCH_INTERVAL", envErrs),
		"how often a running job's nodes are looked at (0: 2s; $FERRY_JOB_WATCH_INTERVAL)")
	addStoreFlags(f, &opts.Store, envErrs)
	addWebhookFlags(f, opts)
	addExternalMetricsFlags(f, opts)
	addEndpointFlags(f, &opts.Endpoints)
	addElectionFlags(f, &cf.election, envErrs)
	f.DurationVar(&opts.WindowLead, "window-lead", envDuration("FERRY_WINDOW_LEAD", envErrs),
		"how long before a reservation or capacity block ends its replicas are replaced (0: 10m; $FERRY_WINDOW_LEAD)")
}

// addWebhookFlags adds the FerryService webhook's flags.
func addWebhookFlags(f *pflag.FlagSet, opts *controller.Options) {
	f.StringVar(&opts.Webhook.Addr, "webhook-addr", os.Getenv("FERRY_WEBHOOK_ADDR"),
		"serve the FerryService validating webhook on this host:port, over HTTPS with --webhook-tls-cert and --webhook-tls-key ($FERRY_WEBHOOK_ADDR)")
	f.StringVar(&opts.Webhook.CertFile, "webhook-tls-cert", os.Getenv("FERRY_WEBHOOK_TLS_CERT"), "the webhook's certificate (PEM) ($FERRY_WEBHOOK_TLS_CERT)")
	f.StringVar(&opts.Webhook.KeyFile, "webhook-tls-key", os.Getenv("FERRY_WEBHOOK_TLS_KEY"), "the key of --webhook-tls-cert (PEM) ($FERRY_WEBHOOK_TLS_KEY)")
}

// addExternalMetricsFlags adds the external metrics API's flags.
func addExternalMetricsFlags(f *pflag.FlagSet, opts *controller.Options) {
	f.StringVar(&opts.ExternalMetrics.Addr, "external-metrics-addr", os.Getenv("FERRY_EXTERNAL_METRICS_ADDR"),
		"serve external.metrics.k8s.io/v1beta1 ("+controller.MetricProxyRequestsInFlight+", for an HPA of the attached proxies) to the API server's aggregation layer on this host:port, over HTTPS with --external-metrics-tls-cert and --external-metrics-tls-key; reaches the API server as --kubeconfig says ($FERRY_EXTERNAL_METRICS_ADDR)")
	f.StringVar(&opts.ExternalMetrics.CertFile, "external-metrics-tls-cert", os.Getenv("FERRY_EXTERNAL_METRICS_TLS_CERT"), "the external metrics API's certificate (PEM), for <service>.<namespace>.svc of its APIService ($FERRY_EXTERNAL_METRICS_TLS_CERT)")
	f.StringVar(&opts.ExternalMetrics.KeyFile, "external-metrics-tls-key", os.Getenv("FERRY_EXTERNAL_METRICS_TLS_KEY"), "the key of --external-metrics-tls-cert (PEM) ($FERRY_EXTERNAL_METRICS_TLS_KEY)")
}

// addEndpointFlags adds the flags that give each FerryService a Service (and an HTTPRoute) of
// its own.
func addEndpointFlags(f *pflag.FlagSet, o *controller.EndpointOptions) {
	f.StringVar(&o.Via, "service-endpoints-via", os.Getenv("FERRY_SERVICE_ENDPOINTS_VIA"),
		"with --store kubernetes: give each FerryService a Kubernetes Service of its name leading to the attached gateway proxies (ferry proxy --attach-all) behind this Service, [https://]NAME[.NAMESPACE]:PORT such as ferry-proxy:80 (NAMESPACE: --namespace; in it a selector Service, elsewhere an ExternalName), and make its status.endpoint http://NAME.NAMESPACE.svc:PORT ($FERRY_SERVICE_ENDPOINTS_VIA)")
	var parents []string
	if env := os.Getenv("FERRY_SERVICE_HTTPROUTE_PARENTS"); env != "" {
		parents = strings.Split(env, ";")
	}
	f.StringArrayVar(&o.RouteParents, "service-httproute-parent", parents,
		"with --service-endpoints-via: also keep a Gateway API HTTPRoute per FerryService attached to this parent, KEY=VALUE[,KEY=VALUE...] of name, namespace, sectionName, port, group, kind, such as name=public,namespace=gateways; repeat for more parents; none where the cluster does not serve HTTPRoute v1 ($FERRY_SERVICE_HTTPROUTE_PARENTS, ';' between parents)")
	f.StringVar(&o.RouteHostname, "service-httproute-hostname", os.Getenv("FERRY_SERVICE_HTTPROUTE_HOSTNAME"),
		"the HTTPRoute's hostname, {name} and {namespace} standing for the FerryService's, such as '{name}.llm.example.com' ($FERRY_SERVICE_HTTPROUTE_HOSTNAME)")
}

// addStoreFlags adds --store and the Kubernetes connection flags (shared with --leader-elect:
// the Lease lives beside the state), and the client-side rate limit of every Kubernetes client.
func addStoreFlags(f *pflag.FlagSet, o *controller.StoreOptions, envErrs *[]error) {
	f.StringVar(&o.Kind, "store", envOr("FERRY_STORE", controller.StoreSQLite),
		"where the state is: sqlite (a file in FERRY_HOME) or kubernetes (objects in --namespace, for controllers that fail over) ($FERRY_STORE)")
	f.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig for --store kubernetes (default: in-cluster; $KUBECONFIG)")
	f.StringVar(&o.Context, "kube-context", "", "context of --kubeconfig (default: its current context)")
	f.StringVar(&o.Namespace, "namespace", os.Getenv("FERRY_NAMESPACE"), "namespace of the state (default: the pod's, else ferry; $FERRY_NAMESPACE)")
	f.Float32Var(&o.QPS, "kube-api-qps", envFloat32("FERRY_KUBE_API_QPS", envErrs),
		fmt.Sprintf("requests per second each Kubernetes client (store, leader election, FerryService watch, each kubernetes infra) may send, client-side (0: %g, sized for 1,000 replicas; negative: no client-side limit; $FERRY_KUBE_API_QPS)", kubelauncher.DefaultQPS))
	f.IntVar(&o.Burst, "kube-api-burst", envInt("FERRY_KUBE_API_BURST", envErrs),
		fmt.Sprintf("requests each Kubernetes client may send in a burst before --kube-api-qps paces it (0: %d; $FERRY_KUBE_API_BURST)", kubelauncher.DefaultBurst))
}

// envFloat32 is envInt for a number with a fraction.
func envFloat32(name string, errs *[]error) float32 {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.ParseFloat(v, 32)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("$%s %q: want a number", name, v))
	}
	return float32(n)
}

// envDuration is envOr for a duration setting ("15s"), 0 when unset; a bad value is added to
// errs.
func envDuration(name string, errs *[]error) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("$%s %q: want a duration such as 15s", name, v))
	}
	return d
}

// envOr is the value of an environment variable, or def when it is unset. The CLI starts the
// controller with only --log-file, so settings for it travel through the environment.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// envInt is envOr for an integer setting, 0 when unset; a value that is not an integer is added
// to errs, for the command to report.
func envInt(name string, errs *[]error) int {
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("$%s %q: want an integer", name, v))
	}
	return n
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.TimeKey = "ts"
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	cfg.OutputPaths = []string{"stderr"}
	cfg.Sampling = nil
	return cfg.Build()
}

func newControllerStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "status",
		Short:   "Show whether the controller runs, where, and since when",
		Example: "  ferry controller status",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := home.Default()
			if err != nil {
				return err
			}
			_, st, err := connect(cmd.Context(), h)
			if err != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "Controller: not running (home %s)\n", h.Dir)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Controller: running\n  pid:      %d\n  socket:   %s\n  api:      %s\n  gateway:  %s\n  metrics:  %s\n  home:     %s\n  version:  %s\n  uptime:   %s\n  services: %d\n",
				st.PID, st.Socket, orOff(st.Addr), orOff(st.Gateway), orOff(st.Metrics), st.Home, st.Version, humanDuration(time.Since(st.StartedAt)), st.Services)
			return nil
		},
	}
}

// orOff shows an optional listener's URL, or "off" when it does not run.
func orOff(url string) string {
	if url == "" {
		return "off"
	}
	return url
}

func newControllerStopCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stop",
		Short: "Stop the controller; replicas keep running and are adopted when it starts again",
		Long: `Stop the controller. Replicas keep running; the next command starts a controller that adopts
them. Service endpoints are served by the controller, so they are down until then.`,
		Example: "  ferry controller stop",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := home.Default()
			if err != nil {
				return err
			}
			c, st, err := connect(cmd.Context(), h)
			if err != nil {
				fmt.Fprintln(cmd.OutOrStdout(), "Controller: not running")
				return nil
			}
			if err := c.StopController(cmd.Context()); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			for ctx.Err() == nil {
				if syscall.Kill(st.PID, 0) != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "Controller stopped (pid %d).\n", st.PID)
					return nil
				}
				time.Sleep(50 * time.Millisecond)
			}
			return fmt.Errorf("controller (pid %d) still running after 30s", st.PID)
		},
	}
}

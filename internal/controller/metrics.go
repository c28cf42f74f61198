package controller

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/provision"
	"github.com/ferryserve/ferry/proxy"
)

// adminShutdownTimeout bounds waiting for a scrape in progress when the controller stops.
const adminShutdownTimeout = 5 * time.Second

// initMetrics creates the controller's registry, whose proxy metrics every service and the
// gateway share, and the control plane's own metrics (controlplane.go).
func (c *Controller) initMetrics() error {
	reg, m, err := proxy.NewRegistry()
	if err != nil {
		return err
	}
	control, err := registerControlPlane(reg, c)
	if err != nil {
		return err
	}
	usage, err := newUsageMetrics(reg)
	if err != nil {
		return err
	}
	c.registry, c.metrics, c.control, c.usageMetrics = reg, m, control, usage
	return nil
}

// startMetrics serves /metrics and /healthz on their own listener, apart from service traffic,
// so a scrape works while the endpoints are saturated and metrics are never exposed where
// clients connect. Like the gateway, the default address may be taken (by a second FERRY_HOME's
// controller): then the controller runs without it. An address the user chose must work.
func (c *Controller) startMetrics() error {
	addr := c.opts.MetricsAddr
	ln, err := c.listenOptional(addr, DefaultMetricsAddr, "metrics")
	if ln == nil {
		return err
	}
	token, err := c.metricsToken()
	if err != nil {
		_ = ln.Close()
		return err
	}
	c.stopAdmin = proxy.ServeAdmin(ln, c.registry, token, nil, c.log.Named("metrics"))
	c.metricsAddr = ln.Addr().String()
	c.log.Info("metrics serving", zap.String("endpoint", c.metricsURL()), zap.Bool("token_required", token != ""))
	return nil
}

// maxTokenFileSize bounds reading a token file: it holds one token.
const maxTokenFileSize = 4 << 10

// metricsToken is the token /metrics requires: Options.MetricsToken, else the one in the
// home's metrics.token when there is one (home.MetricsTokenPath), else none. The controller
// the CLI starts on first use gets no --metrics-token-file, so a token the user puts there
// protects /metrics however the controller was started; the Helm chart mounts its metrics
// token at the same place. A file that is there but empty, short or holds more than one token
// is an error, not an open /metrics.
func (c *Controller) metricsToken() (string, error) {
	if c.opts.MetricsToken != "" || c.opts.Home.Dir == "" {
		return c.opts.MetricsToken, nil
	}
	path := c.opts.Home.MetricsTokenPath()
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("metrics token: %w", err)
	}
	if !info.Mode().IsRegular() || info.Size() > maxTokenFileSize {
		return "", fmt.Errorf("metrics token: %s must be a file holding one token (at most %d bytes)", path, maxTokenFileSize)
	}
	tok, err := c.opts.Home.MetricsToken()
	if err != nil {
		return "", err
	}
	if len(tok) < proxy.MinAdminTokenLength || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("metrics token: %s must hold one token of at least %d characters without whitespace (remove the file to serve /metrics without a token)",
			path, proxy.MinAdminTokenLength)
	}
	return tok, nil
}

// stopMetrics closes the metrics listener and waits until its address is free. Start calls it
// last, so that the drain of every service can still be scraped.
func (c *Controller) stopMetrics() {
	if c.stopAdmin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancel()
	c.stopAdmin(ctx)
}

// listenOptional binds an optional listener (the gateway, metrics): none when addr is empty or
// ListenerOff. The default address may be taken (by a second FERRY_HOME's controller, say): then
// the controller runs without that listener rather than not at all; an address the user chose
// must bind. A nil listener with a nil error means "run without it".
func (c *Controller) listenOptional(addr, defaultAddr, what string) (net.Listener, error) {
	if addr == "" || addr == ListenerOff {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if addr == defaultAddr && errors.Is(err, syscall.EADDRINUSE) {
			c.log.Warn(what+" address in use; running without it", zap.String("addr", addr))
			return nil, nil
		}
		return nil, fmt.Errorf("%s listen on %s: %w", what, addr, err)
	}
	return ln, nil
}

// metricsURL is where Prometheus scrapes this controller; empty without a metrics listener.
func (c *Controller) metricsURL() string {
	if c.metricsAddr == "" {
		return ""
	}
	return "http://" + c.metricsAddr + "/metrics"
}

// fleetCollector exports what the controller knows of its fleet, computed at each scrape from
// the replica managers, the scale loops' targets and the jobs manager, so nothing on their
// paths changes to keep a gauge up to date:
//
//	ferry_replicas{service,status,kind,infra,zone}   replica records by SkyServe status; kind spot or on_demand
//	ferry_autoscaler_target_replicas{service}        the replica count asked for (autoscaler or fixed), once decided
//	ferry_jobs{state}                                managed jobs by state, terminal ones included
//	ferry_cost_dollars_per_hour{workload,name,kind}  the catalog price of every instance held now (what `ferry capacity` lists)
//
// and the provisioner's view of the infras (infraCollector). Only the leader's controller runs
// services and jobs, so these series come from it alone.
type fleetCollector struct{ c *Controller }

var (
	replicasDesc = prometheus.NewDesc("ferry_replicas",
		"Replicas by status (PROVISIONING, READY, ...), kind (spot, on_demand), infra and zone (\"none\" when the infra has none).",
		[]string{"service", "status", "kind", "infra", "zone"}, nil)
	targetDesc = prometheus.NewDesc("ferry_autoscaler_target_replicas",
		"The replica count the service asks for: the autoscaler's last decision or the fixed count.",
		[]string{"service"}, nil)
	jobsDesc = prometheus.NewDesc("ferry_jobs", "Managed jobs by state, terminal states included.", []string{"state"}, nil)
	costDesc = prometheus.NewDesc("ferry_cost_dollars_per_hour",
		"What the instances held now cost per hour, at the catalog price each was launched at; workload is service or job.",
		[]string{"workload", "name", "kind"}, nil)
)

var _ prometheus.Collector = fleetCollector{}

func (f fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{replicasDesc, targetDesc, jobsDesc, costDesc} {
		ch <- d
	}
	infraCollector{}.Describe(ch)
}

func (f fleetCollector) Collect(ch chan<- prometheus.Metric) {
	type replicaKey struct{ service, status, kind, infra, zone string }
	type costKey struct{ workload, name, kind string }
	counts, cost := map[replicaKey]int{}, map[costKey]float64{}
	for _, s := range f.c.serviceList() {
		if target, known := (serviceFleet{f.c, s}).Target(); known {
			ch <- prometheus.MustNewConstMetric(targetDesc, prometheus.GaugeValue, float64(target), s.name)
		}
		for _, r := range s.mgr.Replicas() {
			counts[replicaKey{s.name, string(r.Status), capacityKind(r.Spot), orNone(r.Infra), orNone(r.Zone)}]++
		}
	}
	states := map[jobs.State]int{}
	if f.c.jobs != nil {
		for _, j := range f.c.jobs.List() {
			states[j.State]++
		}
	}
	for _, h := range f.c.capacity() {
		cost[costKey{h.Kind, h.Owner, capacityKind(h.Spot)}] += h.PricePerHour
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(replicasDesc, prometheus.GaugeValue, float64(n), k.service, k.status, k.kind, k.infra, k.zone)
	}
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(n), string(state))
	}
	for k, dollars := range cost {
		ch <- prometheus.MustNewConstMetric(costDesc, prometheus.GaugeValue, dollars, k.workload, k.name, k.kind)
	}
	if f.c.provider != nil {
		infraCollector{f.c.provider}.Collect(ch)
	}
}

// infraCollector exports the provisioner's breakers, the errors they counted and the
// leftovers its janitor holds, read at each scrape, so that an alert fires on an infra that
// fails without anyone running `ferry check`:
//
//	ferry_infra_up{infra,zone}             1 when calls go (up, or throttled: it answers), 0 when down; zone "" is the whole infra
//	ferry_infra_errors_total{infra,class}  failures by class (provision.Class*: unavailable, throttled, timeout, ...)
//	ferry_infra_leftovers{infra}           what teardowns could not stop there, waiting for the infra to answer
//
// Every enabled infra has its up and leftovers series from the start (0 leftovers), so that
// a rate or an absence alert does not wait for the first failure.
type infraCollector struct{ p *provision.Provisioner }

var (
	infraUpDesc = prometheus.NewDesc("ferry_infra_up",
		"Whether calls to an infra (zone \"\") or to one of its zones or regions go: 1 up or throttled, 0 down (its breaker open).",
		[]string{"infra", "zone"}, nil)
	infraErrorsDesc = prometheus.NewDesc("ferry_infra_errors_total",
		"Failed calls to an infra by class: timeout, unavailable, throttled, unauthorized, not_found, capacity, quota, invalid, other.",
		[]string{"infra", "class"}, nil)
	infraLeftoversDesc = prometheus.NewDesc("ferry_infra_leftovers",
		"Instances (or selectors over an infra that could not be listed) that a teardown could not stop, which Ferry stops when the infra answers again.",
		[]string{"infra"}, nil)
)

var _ prometheus.Collector = infraCollector{}

func (infraCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- infraUpDesc
	ch <- infraErrorsDesc
	ch <- infraLeftoversDesc
}

func (ic infraCollector) Collect(ch chan<- prometheus.Metric) {
	h := ic.p.Health()
	left := map[string]int{}
	for _, s := range h.States() {
		up := 1.0
		if s.State == launcher.InfraDown {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(infraUpDesc, prometheus.GaugeValue, up, s.Infra, s.Zone)
		if _, seen := left[s.Infra]; !seen && s.Zone == "" {
			left[s.Infra] = 0
		}
	}
	for k, n := range h.Errors() {
		ch <- prometheus.MustNewConstMetric(infraErrorsDesc, prometheus.CounterValue, float64(n), k.Infra, k.Class)
	}
	for _, l := range ic.p.Leftovers() {
		left[l.Infra]++
	}
	for infra, n := range left {
		ch <- prometheus.MustNewConstMetric(infraLeftoversDesc, prometheus.GaugeValue, float64(n), infra)
	}
}

func capacityKind(spot bool) string {
	if spot {
		return "spot"
	}
	return "on_demand"
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/internal/api"
)

// scenario runs the phases in order on one env and fills the report.
type scenario struct {
	opts     options
	e        *env
	progress func(string, ...any)
	rep      *report
	// adopted is each service's replica instances as the first leader reported them once every
	// replica was READY: what the new leader must adopt.
	adopted map[string]string
}

// statusTimeout bounds one `serve status` of the whole fleet.
const statusTimeout = 20 * time.Second

func (s *scenario) run(ctx context.Context) error {
	leader := s.e.ctls[0]
	rss := sampleRSS(leader.proc.PID, 500*time.Millisecond)
	if err := s.up(ctx); err != nil {
		rss.stop()
		return err
	}
	err := s.waitReady(ctx, leader)
	if err == nil {
		err = s.readReconcile(ctx, leader)
	}
	s.rep.LeaderRSS = rss.stop()
	if err != nil {
		return err
	}
	if err := s.takeover(ctx); err != nil {
		return fmt.Errorf("takeover: %w", err)
	}
	return s.down(ctx)
}

// serviceName is the i-th service's name.
func serviceName(i int) string { return fmt.Sprintf("chat-%03d", i) }

// serviceYAML is what a user would write for one of the fleet's services: a model on one L4
// per replica, a fixed replica count. The kubelet stand-in ignores the run line and runs
// replica-sim with REPLICA_SIM_ARGS instead.
func serviceYAML(name string, replicas int) string {
	return fmt.Sprintf(`name: %s
resources:
  infra: kubernetes
  accelerators: L4:1
envs:
  REPLICA_SIM_ARGS: --model %s
service:
  readiness_probe: /health
  replicas: %d
  ports: 8080
run: vllm serve meta-llama/Llama-3.1-8B-Instruct --served-model-name %s --port 8080
`, name, simModel, replicas, simModel)
}

// up runs `serve up --no-wait` for every service, opts.upParallel at a time, and records when
// the last one returned.
func (s *scenario) up(ctx context.Context) error {
	s.progress("serve up: %d services × %d replicas (%d at a time)", s.opts.services, s.opts.replicas, s.opts.upParallel)
	began := time.Now()
	sem := make(chan struct{}, s.opts.upParallel)
	errs := make([]error, s.opts.services)
	var wg sync.WaitGroup
	for i := range s.opts.services {
		name := serviceName(i)
		path := filepath.Join(s.e.tasks, name+".yaml")
		if err := os.WriteFile(path, []byte(serviceYAML(name, s.opts.replicas)), 0o644); err != nil {
			return err
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			_, errs[i] = s.e.ctls[0].f.Run(ctx, "up-"+name, 2*time.Minute, "serve", "up", path, "-y", "--no-wait")
			if (i+1)%10 == 0 {
				s.progress("  serve up returned for %d of %d", i+1, s.opts.services)
			}
		})
	}
	wg.Wait()
	s.rep.lastUp = time.Now()
	s.rep.UpSeconds = s.rep.lastUp.Sub(began).Seconds()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// waitReady polls the leader until every replica of every service is READY, printing progress,
// at most the target plus three minutes (to measure a miss too).
func (s *scenario) waitReady(ctx context.Context, leader *controller) error {
	want := s.opts.services * s.opts.replicas
	lastPrint := time.Time{}
	var ready, readyServices int
	err := servicekit.PollUntil(ctx, s.opts.readyTarget+3*time.Minute, 2*time.Second, func() (bool, error) {
		list, err := leader.f.Services(ctx, statusTimeout)
		if err != nil {
			s.progress("  serve status: %v", err)
			return false, nil
		}
		ready, readyServices = countReady(list, s.opts.replicas)
		s.adopted = instances(list)
		if time.Since(lastPrint) >= 5*time.Second {
			s.progress("  READY %d/%d replicas, %d/%d services, %.0fs after the last serve up", ready, want, readyServices, s.opts.services, time.Since(s.rep.lastUp).Seconds())
			lastPrint = time.Now()
		}
		return len(list) == s.opts.services && readyServices == s.opts.services, nil
	})
	if err != nil {
		s.rep.ReadySeconds = -1
		s.rep.Notes = append(s.rep.Notes, fmt.Sprintf("not every replica READY: %d/%d, %d/%d services (%v)", ready, want, readyServices, s.opts.services, err))
		return nil
	}
	s.rep.ReadySeconds = time.Since(s.rep.lastUp).Seconds()
	s.progress("every replica READY %.1fs after the last serve up", s.rep.ReadySeconds)
	return nil
}

// instances maps each service to its replicas' instances, sorted and joined.
func instances(list []api.ServiceStatus) map[string]string {
	out := make(map[string]string, len(list))
	for _, st := range list {
		ids := make([]string, 0, len(st.Replicas))
		for _, r := range st.Replicas {
			ids = append(ids, r.InstanceID)
		}
		slices.Sort(ids)
		out[st.Name] = strings.Join(ids, ",")
	}
	return out
}

// countReady counts READY replicas and the services with all wantPerService of them READY.
func countReady(list []api.ServiceStatus, wantPerService int) (replicas, services int) {
	for _, st := range list {
		replicas += st.ReadyReplicas
		if st.ReadyReplicas >= wantPerService && st.Status == "READY" {
			services++
		}
	}
	return replicas, services
}

// readReconcile reads the leader's reconcile histogram: every pass since it started, the
// scale-up included.
func (s *scenario) readReconcile(ctx context.Context, leader *controller) error {
	h, err := scrapeHistogram(ctx, leader.metricsURL, "ferry_reconcile_duration_seconds", "loop", "replicas")
	if err != nil {
		return err
	}
	s.rep.ReconcilePasses = h.count
	s.rep.ReconcileP99 = h.quantile(0.99)
	s.rep.ReconcileMean = h.sum / float64(max(h.count, 1))
	// What a slow pass waits on: the client-side rate limit, or store writes (each waits until
	// the watch cache shows it).
	if wait, err := scrapeHistogram(ctx, leader.metricsURL, "ferry_kube_client_rate_limiter_wait_seconds", "", ""); err == nil {
		s.rep.RateLimiterWaitP99 = wait.quantile(0.99)
	}
	if writes, err := scrapeHistogram(ctx, leader.metricsURL, "ferry_store_write_duration_seconds", "store", "kubernetes"); err == nil {
		s.rep.StoreWriteP99, s.rep.StoreWrites = writes.quantile(0.99), writes.count
	}
	// The writes a new service's first pass makes in a row: its ids, then its records; and the
	// requests under them as the client saw them.
	s.rep.StoreWriteP99ByOp = map[string]float64{}
	for _, op := range []string{"NextReplicaIDs", "SaveReplica"} {
		writes, err := scrapeHistogramWhere(ctx, leader.metricsURL, "ferry_store_write_duration_seconds", func(m *dto.Metric) bool {
			return labelValue(m, "store") == "kubernetes" && labelValue(m, "op") == op
		})
		if err == nil {
			s.rep.StoreWriteP99ByOp[op] = writes.quantile(0.99)
		}
	}
	s.rep.ClientRequestP99ByVerb = map[string]float64{}
	for _, verb := range []string{"POST", "PUT", "GET"} {
		if h, err := scrapeHistogram(ctx, leader.metricsURL, "ferry_kube_client_request_duration_seconds", "verb", verb); err == nil {
			s.rep.ClientRequestP99ByVerb[verb] = h.quantile(0.99)
		}
	}
	// The API server's own time for the store's writes, so that a slow store write can be
	// told apart: the API server, or the wait for the writer's watch cache to show it.
	if api, err := s.e.apiWrites(ctx); err == nil {
		s.rep.APIWriteP99, s.rep.APIWriteMean = api.quantile(0.99), api.sum/float64(max(api.count, 1))
	} else {
		s.progress("API server's write latency unread: %v", err)
	}
	s.progress("reconcile passes %d, p99 %.3fs (mean %.3fs); store writes %d, p99 %.3fs (by op %v; client requests p99 by verb %v); API server's ConfigMap writes p99 %.3fs (mean %.3fs); client rate-limiter wait p99 %.3fs",
		h.count, s.rep.ReconcileP99, s.rep.ReconcileMean, s.rep.StoreWrites, s.rep.StoreWriteP99, s.rep.StoreWriteP99ByOp, s.rep.ClientRequestP99ByVerb, s.rep.APIWriteP99, s.rep.APIWriteMean, s.rep.RateLimiterWaitP99)
	return nil
}

// apiWrites is the API server's apiserver_request_duration_seconds for ConfigMap writes (the
// store's records) since it started.
func (e *env) apiWrites(ctx context.Context) (histogram, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	raw, err := e.cluster.Client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return histogram{}, err
	}
	return parseHistogram(bytes.NewReader(raw), "apiserver_request_duration_seconds", func(m *dto.Metric) bool {
		verb := labelValue(m, "verb")
		return labelValue(m, "resource") == "configmaps" && (verb == "POST" || verb == "PUT" || verb == "PATCH")
	})
}

// lease is the controllers' Lease.
func (e *env) lease(ctx context.Context) (*coordinationv1.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return e.cluster.Client().CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
}

// down runs `serve down -a` through the new leader and times it until every pod is gone.
func (s *scenario) down(ctx context.Context) error {
	s.progress("serve down -a")
	began := time.Now()
	_, err := s.e.ctls[1].f.Run(ctx, "down-all", s.opts.downTarget+2*time.Minute, "serve", "down", "-a", "-y")
	s.rep.DownCLISeconds = time.Since(began).Seconds()
	if err != nil {
		s.rep.Notes = append(s.rep.Notes, fmt.Sprintf("serve down -a: %v", err))
	}
	var left int
	err = servicekit.PollUntil(ctx, s.opts.downTarget+2*time.Minute, 200*time.Millisecond, func() (bool, error) {
		pods, err := s.e.pods(ctx)
		if err != nil {
			return false, nil
		}
		left = len(pods)
		return left == 0, nil
	})
	if err != nil {
		s.rep.DownSeconds = -1
		s.rep.Notes = append(s.rep.Notes, fmt.Sprintf("%d pods left after serve down -a (%v)", left, err))
		return nil
	}
	s.rep.DownSeconds = time.Since(began).Seconds()
	s.progress("every pod gone %.1fs after serve down -a began (the command took %.1fs)", s.rep.DownSeconds, s.rep.DownCLISeconds)
	return nil
}

// pods maps the namespace's pods, those being deleted too, by name to their UID.
func (e *env) pods(ctx context.Context) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := e.cluster.Client().CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(list.Items))
	for _, p := range list.Items {
		out[p.Name] = string(p.UID)
	}
	return out, nil
}

// killLeader SIGKILLs the leading controller and waits until it is gone.
func killLeader(c *controller) (time.Time, error) {
	if err := syscall.Kill(c.proc.PID, syscall.SIGKILL); err != nil {
		return time.Time{}, err
	}
	killed := time.Now()
	select {
	case <-c.proc.Exited():
	case <-time.After(10 * time.Second):
		return killed, fmt.Errorf("%s still alive 10s after SIGKILL", c.id)
	}
	return killed, nil
}

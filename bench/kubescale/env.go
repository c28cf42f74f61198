package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/internal/testcluster"
)

// What the run is made of: the test cluster with kwok GPU nodes, the kubelet stand-in serving
// every replica pod in this process, two controllers electing a leader over the Kubernetes
// store (their homes share tokens, as the chart's controller pods share a Secret), and the
// attached proxies of the request loop.

const (
	// namespace holds the controllers' state, their Lease and the replica pods.
	namespace = "ferry-kubescale"
	// leaseName is the controllers' Lease (--lease-name's default).
	leaseName = "ferry-controller"
	// gpuProduct is the kwok nodes' GPU, and the services ask for one each.
	gpuProduct = "NVIDIA-L4"
	// simModel is what the replicas serve.
	simModel = "llama-3.1-8b-instruct"
)

// env is everything the scenario runs against.
type env struct {
	opts    options
	group   *childproc.Group
	cluster *testcluster.Cluster
	// stopKubelet ends the kubelet stand-in and waits for it.
	stopKubelet func()
	ctls        [2]*controller
	// proxyHome is the attached proxies' FERRY_HOME: only the attach token.
	proxyHome *servicekit.Ferry
	tasks     string
}

// controller is one `ferry controller --leader-elect` process with a home of its own.
type controller struct {
	id, url, metricsURL string
	f                   *servicekit.Ferry
	proc                *childproc.Proc
}

// setup starts the cluster, its nodes, the kubelet stand-in and both controllers, the first
// leading.
func setup(ctx context.Context, opts options, progress func(string, ...any)) (*env, error) {
	group, err := childproc.NewGroup(filepath.Join(opts.out, "logs"))
	if err != nil {
		return nil, err
	}
	e := &env{opts: opts, group: group, tasks: filepath.Join(opts.out, "tasks")}
	if err := os.MkdirAll(e.tasks, 0o755); err != nil {
		return nil, err
	}
	if err := e.startCluster(ctx, progress); err != nil {
		e.close()
		return nil, err
	}
	if err := e.startControllers(ctx, progress); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// nodes is how many kwok nodes hold the replicas, one GPU each.
func (o options) nodes() int {
	return (o.services*o.replicas + o.gpusPerNode - 1) / o.gpusPerNode
}

func (e *env) startCluster(ctx context.Context, progress func(string, ...any)) error {
	pods := e.opts.services * e.opts.replicas
	progress("starting the Kubernetes test cluster (etcd, kube-apiserver, kube-scheduler, kwok) for %d pods", pods)
	root, err := testcluster.RepoRoot()
	if err != nil {
		return err
	}
	// Twice the pods: kwok hands a deleted pod's IP out again only once it has recycled it.
	if e.cluster, err = testcluster.Start(ctx, testcluster.Options{RepoRoot: root, TempDir: e.opts.out, PodIPs: 2*pods + 50}); err != nil {
		return err
	}
	progress("adding %d kwok nodes of %d × %s (pod IPs from %s)", e.opts.nodes(), e.opts.gpusPerNode, gpuProduct, e.cluster.CIDR())
	if err := e.addNodes(ctx); err != nil {
		return err
	}
	if _, err := e.cluster.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The chart's fencing policy, as its default with leader election renders it: the store
	// trusts its own view only where the API server enforces it (kubestore's probeFence).
	if e.opts.fence {
		if err := testcluster.InstallFencing(ctx, e.cluster.Client(), namespace, leaseName, testcluster.FenceState); err != nil {
			return err
		}
	}
	stop, err := testcluster.BackgroundKubelet(e.cluster, testcluster.KubeletOptions{InProcessReplicas: true, LogDir: filepath.Join(e.opts.out, "logs", "pods")})
	if err != nil {
		return err
	}
	e.stopKubelet = stop
	return nil
}

// addNodes adds the kwok nodes, a few at a time: each waits until its node is Ready.
func (e *env) addNodes(ctx context.Context) error {
	sem := make(chan struct{}, 8)
	errs := make([]error, e.opts.nodes())
	var wg sync.WaitGroup
	for i := range errs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = e.cluster.AddGPUNode(ctx, fmt.Sprintf("l4-%03d", i), gpuProduct, e.opts.gpusPerNode)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// startControllers starts ctl-a, waits until it leads, then starts ctl-b.
func (e *env) startControllers(ctx context.Context, progress func(string, ...any)) error {
	firstPort, err := firstServicePort(e.opts.services)
	if err != nil {
		return err
	}
	for i, id := range []string{"ctl-a", "ctl-b"} {
		if e.ctls[i], err = e.newController(id); err != nil {
			return err
		}
	}
	if e.proxyHome, err = e.newHome("home-proxy", "off"); err != nil {
		return err
	}
	for i, c := range e.ctls {
		progress("starting %s (ferry controller --store kubernetes --leader-elect), API %s, metrics %s", c.id, c.url, c.metricsURL)
		if c.proc, err = c.f.Start(c.id, c.args(e, firstPort)...); err != nil {
			return err
		}
		if i == 0 {
			err := servicekit.PollUntil(ctx, time.Minute, 100*time.Millisecond, func() (bool, error) {
				return e.leaseHolder(ctx) == c.id, nil
			})
			if err != nil {
				return fmt.Errorf("%s never led (holder %q): %w; log: %s", c.id, e.leaseHolder(ctx), err, c.proc.LogTail(2000))
			}
		}
	}
	return servicekit.PollUntil(ctx, time.Minute, 100*time.Millisecond, func() (bool, error) {
		_, err := e.ctls[1].f.Services(ctx, 5*time.Second) // the follower forwards to the leader
		return err == nil, nil
	})
}

// newController prepares a controller's home: the shared tokens and a config enabling the
// cluster's context in the namespace.
func (e *env) newController(id string) (*controller, error) {
	listen, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	metrics, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	f, err := e.newHome("home-"+strings.TrimPrefix(id, "ctl-"), metrics)
	if err != nil {
		return nil, err
	}
	config := fmt.Sprintf("kubernetes:\n  kubeconfig: %s\n  contexts:\n    - name: %s\n      namespace: %s\n",
		e.cluster.Kubeconfig(), e.cluster.Context(), namespace)
	if err := os.WriteFile(filepath.Join(f.Home.Dir, "config.yaml"), []byte(config), 0o600); err != nil {
		return nil, err
	}
	return &controller{id: id, url: "http://" + listen, metricsURL: "http://" + metrics + "/metrics", f: f}, nil
}

// newHome is a FERRY_HOME under the output directory holding the shared tokens: a call
// forwarded from the follower carries the caller's token, so both controllers need the same.
func (e *env) newHome(name, metricsAddr string) (*servicekit.Ferry, error) {
	f, err := servicekit.NewFerry(e.opts.ferryBin, filepath.Join(e.opts.out, name), "", metricsAddr, e.group)
	if err != nil {
		return nil, err
	}
	for _, tok := range []struct{ path, value string }{
		{f.Home.TokenPath(), "kubescale-controller-token-0123456789"},
		{f.Home.ProxyTokenPath(), "kubescale-attach-token-0123456789"},
	} {
		if err := os.WriteFile(tok.path, []byte(tok.value+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// args is the controller's command line: what the chart runs, on loopback.
func (c *controller) args(e *env, firstServicePort int) []string {
	u, _ := url.Parse(c.url)
	metrics, _ := url.Parse(c.metricsURL)
	return []string{"controller",
		"--store", "kubernetes", "--kubeconfig", e.cluster.Kubeconfig(), "--kube-context", e.cluster.Context(),
		"--namespace", namespace, "--leader-elect", "--id", c.id, "--listen", u.Host,
		"--gateway", "off", "--metrics-addr", metrics.Host, "--first-service-port", strconv.Itoa(firstServicePort)}
}

// firstServicePort is the first of n consecutive loopback ports, free a moment ago, for the
// service endpoints. Both controllers use the same range, as two controller pods do, and the new
// leader binds each service's endpoint where the old one had it. It lies below the kernel's
// ephemeral range (32768 and up by default): there, the source port of one of the many
// outgoing connections (probes, scrapes) would take an endpoint's port on 127.0.0.1 between the
// old leader's death and the new one's restore, which a real controller on a pod IP of its own
// never meets.
func firstServicePort(n int) (int, error) {
	for range 100 {
		base := 15000 + rand.IntN(15000)
		if portsFree(base, n) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("no %d free consecutive loopback ports between 15000 and 30000", n)
}

// portsFree reports whether ports base to base+n-1 can be bound on 127.0.0.1 now.
func portsFree(base, n int) bool {
	for port := base; port < base+n; port++ {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return false
		}
		_ = ln.Close()
	}
	return true
}

// leaseHolder is the Lease's holder, "" without one.
func (e *env) leaseHolder(ctx context.Context) string {
	lease, err := e.lease(ctx)
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// close stops what setup started: the controllers and proxies first, then the stand-in (which
// stops the replicas still served) and the cluster.
func (e *env) close() {
	if e.group != nil {
		e.group.Close()
	}
	if e.stopKubelet != nil {
		e.stopKubelet()
	}
	if e.cluster != nil {
		e.cluster.Stop()
	}
}

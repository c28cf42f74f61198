// Package testcluster runs a real Kubernetes control plane for tests: etcd, kube-apiserver and
// kube-scheduler, with kwok standing in for the kubelets of fake GPU nodes. Tests talk to a real
// API server and a real scheduler, so what they see (a pod Pending with PodScheduled=False,
// reason Unschedulable, because no node has a free nvidia.com/gpu) is what a cluster would do,
// not what a fake client was told to say.
//
// The binaries come from scripts/testcluster/build.sh, built from the Go module proxy and cached
// (about 8 minutes on 2 cores the first time, then instant). scripts/test.sh runs it before
// `go test`, so no test spends its timeout building.
//
// A test binary usually shares one cluster between its tests:
//
//	func TestMain(m *testing.M) { testcluster.Main(m) }
//
//	func TestLaunch(t *testing.T) {
//		c := testcluster.Shared(t)
//		...
//	}
//
// kwok only moves pods through their phases; nothing runs in them. Kubelet starts a
// `ferry replica-sim` for each Running pod, on the pod's loopback IP (or, with
// KubeletOptions.InProcessReplicas, serves it in the test's own process, for a thousand pods),
// so traffic really flows to pods, and runs a job's pod's own command on the host, reporting its exit in the pod's status.
// It also binds volume claims to host directories and serves pod logs to the API server.
//
// A test that needs the API server to go away mid-run (an upgrade, a lost control plane) puts
// an APIProxy in front of it (Cluster.APIProxy): stopping the proxy refuses and cuts that
// test's connections only, and starting it brings the API server back on the same address.
package testcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	// ContextName is the name of the kubeconfig context (and of its cluster entry).
	ContextName = "ferry-test"

	// KwokNodeAnnotation, set to "fake", marks the nodes kwok acts as the kubelet of.
	KwokNodeAnnotation = "kwok.x-k8s.io/node"

	defaultStartTimeout = 2 * time.Minute
)

// errPortTaken marks a start that failed because another process took a port between
// freePorts choosing it and a component binding it; Start then tries again with new ports.
var errPortTaken = errors.New("a port was taken by another process")

// Options configure Start. The zero value is ready to use.
type Options struct {
	// RepoRoot is the Ferry checkout whose scripts/testcluster/build.sh provides the binaries.
	// Default: RepoRoot().
	RepoRoot string

	// BinDir, when set, is used instead of running build.sh: a directory holding etcd,
	// kube-apiserver, kube-scheduler, kwok and kwok-stages.yaml. Default: $FERRY_TESTCLUSTER_BIN.
	BinDir string

	// TempDir is where the cluster's own directory (data, certificates, kubeconfig, logs) is
	// created. Default: os.TempDir().
	TempDir string

	// KeepDir leaves the cluster's directory in place after Stop, for reading its logs. Also
	// set by FERRY_TESTCLUSTER_KEEP=1.
	KeepDir bool

	// StartTimeout bounds the wait for every component to be healthy, not the build.
	// Default: 2 minutes.
	StartTimeout time.Duration

	// PodIPs is how many pods may hold an IP at once. kwok hands them out of a loopback range
	// of /24s (about 250 each) that no other cluster on this machine uses; a cluster for a
	// thousand pods needs a wider one than the default. Default: 250 (one /24).
	PodIPs int

	// Logf receives progress while Start runs (never afterwards), e.g. t.Logf. Default: none.
	Logf func(format string, args ...any)

	// ControllerManager also runs kube-controller-manager with the controllers an autoscaled
	// Deployment needs (ControllerManagerControllers; controllermanager.go).
	ControllerManager bool
}

// Cluster is a running control plane. Its methods are safe for concurrent use.
type Cluster struct {
	dir        string
	keepDir    bool
	binDir     string
	cidr       string
	server     string
	kubeconfig string
	restConfig *rest.Config
	client     kubernetes.Interface
	// kubeletPort is where the nodes' kubelet is (daemonEndpoints.kubeletEndpoint): the
	// API server proxies pod logs there, and a Kubelet stand-in serves them.
	kubeletPort int

	releaseCIDR func()
	procs       []*process // in start order; stopped in reverse
	stopOnce    sync.Once
	// extra are components tests start later (StartSharingScheduler); Stop stops them first.
	extraMu sync.Mutex
	extra   []*process
}

// Start builds the binaries if needed (see scripts/testcluster/build.sh), starts etcd,
// kube-apiserver, kube-scheduler and kwok on free loopback ports, and returns once the API
// server is ready and the scheduler and kwok are serving. On failure the error carries the end of
// the failing component's log, and nothing is left running.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = defaultStartTimeout
	}
	if opts.TempDir == "" {
		opts.TempDir = os.TempDir()
	}
	if os.Getenv("FERRY_TESTCLUSTER_KEEP") == "1" {
		opts.KeepDir = true
	}
	if opts.BinDir == "" {
		opts.BinDir = os.Getenv("FERRY_TESTCLUSTER_BIN")
	}
	if opts.BinDir == "" {
		root := opts.RepoRoot
		if root == "" {
			var err error
			if root, err = RepoRoot(); err != nil {
				return nil, err
			}
		}
		binDir, err := buildBinaries(ctx, root, opts.Logf)
		if err != nil {
			return nil, err
		}
		opts.BinDir = binDir
	} else if err := checkBinDir(opts.BinDir); err != nil {
		return nil, err
	}

	const attempts = 3
	for attempt := 1; ; attempt++ {
		c, err := start(ctx, opts)
		if err == nil {
			return c, nil
		}
		if c == nil {
			return nil, err
		}
		if !errors.Is(err, errPortTaken) || attempt == attempts {
			// Its logs say more than the tail in the error.
			return nil, fmt.Errorf("%w\n(cluster directory kept: %s)", err, c.dir)
		}
		_ = os.RemoveAll(c.dir)
		opts.Logf("testcluster: %v; retrying with other ports", err)
	}
}

// start makes one attempt at starting the cluster. When it fails after creating the cluster's
// directory, it returns the stopped cluster too, whose directory it leaves for Start to keep or
// remove.
func start(ctx context.Context, opts Options) (c *Cluster, err error) {
	began := time.Now()
	dir, err := os.MkdirTemp(opts.TempDir, "ferry-testcluster-")
	if err != nil {
		return nil, err
	}
	c = &Cluster{dir: dir, keepDir: opts.KeepDir, binDir: opts.BinDir, kubeconfig: filepath.Join(dir, "kubeconfig")}
	defer func() {
		if err != nil {
			c.keepDir = true
			c.Stop()
		}
	}()

	cidr, release, err := claimCIDR(podIPBlocks(opts.PodIPs))
	if err != nil {
		return c, err
	}
	c.cidr, c.releaseCIDR = cidr, release

	ports, err := freePorts(6)
	if err != nil {
		return c, err
	}
	etcdPort, etcdPeerPort, apiPort, schedulerPort, kwokPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	c.kubeletPort = ports[5]
	c.server = "https://127.0.0.1:" + strconv.Itoa(apiPort)

	token, err := newToken()
	if err != nil {
		return c, err
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	saKey := filepath.Join(dir, "service-account.key")
	if err := errors.Join(
		writeTokenFile(tokenFile, token),
		writeServiceAccountKey(saKey),
		writeKubeconfig(c.kubeconfig, c.server, token),
	); err != nil {
		return c, err
	}
	c.restConfig = &rest.Config{
		Host:            c.server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             200,
		Burst:           400,
	}
	if c.client, err = kubernetes.NewForConfig(c.restConfig); err != nil {
		return c, err
	}

	aggregation, err := aggregationFlags(dir)
	if err != nil {
		return c, err
	}
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	etcdPeerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeerPort)
	components := []struct {
		name  string
		env   []string
		args  []string
		ready readiness
	}{
		{
			name: "etcd",
			args: []string{
				"--name=ferry-test",
				"--data-dir=" + filepath.Join(dir, "etcd-data"),
				"--listen-client-urls=" + etcdURL,
				"--advertise-client-urls=" + etcdURL,
				"--listen-peer-urls=" + etcdPeerURL,
				"--initial-advertise-peer-urls=" + etcdPeerURL,
				"--initial-cluster=ferry-test=" + etcdPeerURL,
				"--unsafe-no-fsync", // the data is thrown away with the cluster
				"--log-level=warn",
			},
			ready: httpReady(etcdURL+"/health", "", `"health":"true"`),
		},
		{
			name: "kube-apiserver",
			args: append([]string{
				"--etcd-servers=" + etcdURL,
				"--bind-address=127.0.0.1",
				"--advertise-address=127.0.0.1",
				"--secure-port=" + strconv.Itoa(apiPort),
				"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
				"--token-auth-file=" + tokenFile,
				"--authorization-mode=RBAC",
				"--service-account-key-file=" + saKey,
				"--service-account-signing-key-file=" + saKey,
				"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
				"--service-cluster-ip-range=10.96.0.0/16",
				// No controller-manager runs: nothing would create the service account a pod
				// needs, nothing would lift the not-ready taint from a new node, and nothing
				// would remove the protection finalizers of a deleted claim or volume.
				"--disable-admission-plugins=ServiceAccount,TaintNodesByCondition,StorageObjectInUseProtection",
				// kwok gives nodes the addresses InternalIP 127.0.0.1 and Hostname NAME; only
				// the first reaches the kubelet stand-in (pod logs). With no
				// --kubelet-certificate-authority its self-signed certificate is not verified.
				"--kubelet-preferred-address-types=InternalIP",
				"--allow-privileged=true",
				"--enable-priority-and-fairness=false",
				"--profiling=false",
			}, aggregation...),
			ready: httpReady(c.server+"/readyz", token, "ok"),
		},
		{
			name: "kube-scheduler",
			args: []string{
				"--kubeconfig=" + c.kubeconfig,
				"--authentication-kubeconfig=" + c.kubeconfig,
				"--authorization-kubeconfig=" + c.kubeconfig,
				"--bind-address=127.0.0.1",
				"--secure-port=" + strconv.Itoa(schedulerPort),
				"--leader-elect=false",
			},
			ready: httpReady("https://127.0.0.1:"+strconv.Itoa(schedulerPort)+"/healthz", "", "ok"),
		},
		{
			name: "kwok",
			// kwok also reads $HOME/.kwok/kwok.yaml when it exists; a developer's own must not
			// change how the test cluster behaves.
			env: append(os.Environ(), "HOME="+dir),
			args: []string{
				"--kubeconfig=" + c.kubeconfig,
				"--config=" + filepath.Join(c.binDir, "kwok-stages.yaml"),
				"--manage-all-nodes=false",
				"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=fake",
				"--cidr=" + cidr,
				"--node-ip=127.0.0.1",
				// Only advertised as the nodes' kubelet port: kwok itself serves on
				// --server-address, and a Kubelet stand-in listens here.
				"--node-port=" + strconv.Itoa(c.kubeletPort),
				"--node-lease-duration-seconds=0", // the node/heartbeat Stage keeps nodes Ready
				"--server-address=127.0.0.1:" + strconv.Itoa(kwokPort),
			},
			ready: httpReady("http://127.0.0.1:"+strconv.Itoa(kwokPort)+"/healthz", "", "ok"),
		},
	}

	// All at once: the API server waits for etcd, and the scheduler and kwok for the API server.
	checks := make([]check, 0, len(components))
	for _, comp := range components {
		p, err := startProcess(comp.name, filepath.Join(dir, comp.name+".log"), comp.env,
			filepath.Join(c.binDir, comp.name), comp.args...)
		if err != nil {
			return c, err
		}
		c.procs = append(c.procs, p)
		checks = append(checks, check{proc: p, ready: comp.ready})
	}
	if err := waitReady(ctx, checks, opts.StartTimeout); err != nil {
		return c, err
	}
	if opts.ControllerManager {
		cmStart := time.Now()
		if err := c.startControllerManager(ctx, opts.StartTimeout); err != nil {
			return c, err
		}
		opts.Logf("testcluster: kube-controller-manager serving after %v", time.Since(cmStart).Round(time.Millisecond))
	}
	opts.Logf("testcluster: cluster up in %v (dir %s, pod CIDR %s)", time.Since(began).Round(time.Millisecond), dir, cidr)
	return c, nil
}

// podIPBlocks is the number of /24s, a power of two, that hold podIPs pod IPs. kwok hands out
// the range's addresses from its second on and does not stop at its end (it would run into a
// neighbour's range), so count 250 a block, which leaves a margin.
func podIPBlocks(podIPs int) int {
	blocks := 1
	for blocks*250 < podIPs {
		blocks *= 2
	}
	return blocks
}

// readiness reports whether a component serves; the error says why not, for the timeout message.
type readiness func(ctx context.Context) error

type check struct {
	proc  *process
	ready readiness
}

// probeClient talks to the components' health endpoints, whose certificates are self-signed.
var probeClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true},
}

// httpReady is ready when GET url answers 200 with a body containing want.
func httpReady(url, token, want string) readiness {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
			return fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
		}
		return nil
	}
}

// waitReady waits until every check passes, failing fast when a component exits.
func waitReady(ctx context.Context, checks []check, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pending := checks
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastErr := map[*process]error{}
	for {
		var still []check
		for _, ck := range pending {
			if ck.proc.exited() {
				err := ck.proc.failure(fmt.Sprintf("exited while starting (%v)", ck.proc.err))
				if strings.Contains(logTail(ck.proc.logPath), "address already in use") {
					return fmt.Errorf("%w: %w", errPortTaken, err)
				}
				return err
			}
			if err := ck.ready(ctx); err != nil {
				lastErr[ck.proc] = err
				still = append(still, ck)
			}
		}
		if pending = still; len(pending) == 0 {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			// The first one not ready is the likeliest culprit: the rest wait on it.
			ck := pending[0]
			return ck.proc.failure(fmt.Sprintf("not ready after %v (%v)", timeout, lastErr[ck.proc]))
		}
	}
}

// Stop kills every component and removes the cluster's directory (unless Options.KeepDir).
// Nothing in the cluster is worth a graceful shutdown, so all get SIGKILL. Safe to call twice.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.extraMu.Lock()
		for _, p := range c.extra {
			p.stop(0)
		}
		c.extraMu.Unlock()
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.procs[i].stop(0)
		}
		if c.releaseCIDR != nil {
			c.releaseCIDR()
		}
		if !c.keepDir {
			_ = os.RemoveAll(c.dir)
		}
	})
}

// Dir is the cluster's directory: kubeconfig, data, certificates and one log per component.
func (c *Cluster) Dir() string { return c.dir }

// Kubeconfig is the path of a kubeconfig file for the cluster's admin (context Context()).
func (c *Cluster) Kubeconfig() string { return c.kubeconfig }

// Context is the kubeconfig context to select, for code that takes a context name.
func (c *Cluster) Context() string { return ContextName }

// RESTConfig returns a new copy of the admin's client configuration, free to modify.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Client is a clientset for the cluster's admin.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// KubeletPort is the port every node advertises for its kubelet, on 127.0.0.1: the API server
// sends pod log requests there, and a running Kubelet stand-in answers them.
func (c *Cluster) KubeletPort() int { return c.kubeletPort }

// CIDR is the loopback range pod IPs come from, unique among the clusters running on this
// machine, e.g. "127.183.20.0/24" (wider with Options.PodIPs).
func (c *Cluster) CIDR() string { return c.cidr }

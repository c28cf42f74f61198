package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ferryserve/ferry/internal/testcluster"
)

const haYAML = `name: ha
resources:
  infra: local
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 30
  replicas: 2
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT --model ferry-sim-1b
`

// haLease is the Lease the two controllers elect their leader with (--lease-name's default).
const haLease = "ferry-controller"

// TestHAControllerFailover runs two controllers (`ferry controller --store kubernetes
// --leader-elect`) on the real API server test cluster, sharing their state there and their
// local replicas (both homes' local/ is one directory: local infra with HA is a single-host,
// test arrangement), and two attached proxies following them. Under load through both proxies
// the leader is killed with SIGKILL: the other controller must lead within 15 s, adopt the two
// replicas rather than launch any, and no request may fail.
func TestHAControllerFailover(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	ns := testNamespace(t, c, "ha-failover-") // removed last, once the controllers are stopped
	installFencePolicy(t, c.Client(), ns, haLease)

	shared := shortTempDir(t, "ferry-ha-local-")
	a := newHAController(t, c, ns, "ctl-a", shared)
	b := newHAController(t, c, ns, "ctl-b", shared)
	a.start()
	eventually(t, 30*time.Second, "ctl-a leads", func() (bool, string) { return leaseHolder(c, ns) == "ctl-a", leaseHolder(c, ns) })
	b.start()
	t.Cleanup(func() { cleanupHA(t, shared, a, b) })

	file := filepath.Join(t.TempDir(), "ha.yaml")
	writeFile(t, file, haYAML)
	if out := a.mustRun("serve", "up", file, "-y"); !strings.Contains(out, "2/2 READY") {
		t.Fatalf("serve up:\n%s", out)
	}
	before := replicaInstances(t, a.env)
	// The follower answers the CLI by forwarding to the leader, and sends attached proxies
	// there with 503 and X-Ferry-Leader.
	if got := replicaInstances(t, b.env); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("serve status through the follower: %v, want %v as the leader says", got, before)
	}
	checkFollowerRedirects(t, b.url, a.url)
	launched := instanceDirs(t, shared)
	if len(before) != 2 || len(launched) != 2 {
		t.Fatalf("after serve up: replicas %v, instances launched %v; want 2 of each", before, launched)
	}

	// Two proxies, each following whichever controller leads, with only the attach token: one
	// given both controllers' URLs, the other only the follower's (as a single Service URL in
	// front of both would be), which names the leader.
	proxyHome := &env{t: t, home: shortTempDir(t, "ferry-ha-proxy-")}
	copyFile(t, filepath.Join(a.home, "proxy.token"), filepath.Join(proxyHome.home, "proxy.token"))
	// The local replicas listen in the controllers' private network, whose helper's socket is in
	// the shared local/: proxies on this host reach them through it.
	if err := os.Symlink(shared, filepath.Join(proxyHome.home, "local")); err != nil {
		t.Fatal(err)
	}
	var endpoints, proxyLogs []string
	for _, controllers := range []string{a.url + "," + b.url, b.url} {
		listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		proxyLogs = append(proxyLogs, proxyHome.startProxyProcess(t, "proxy", "--attach", "ha", "--controller", controllers, "--listen", listen))
		endpoints = append(endpoints, "http://"+listen)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for _, ep := range endpoints {
		eventually(t, 20*time.Second, "the attached proxy "+ep+" serves", func() (bool, string) {
			if err := completion(client, ep); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
	}

	load := startLoad(client, endpoints)
	defer load.stop()
	eventually(t, 10*time.Second, "load flowing", func() (bool, string) { return load.ok.Load() >= 20, fmt.Sprint(load.ok.Load()) })

	killed := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "ctl-b leads", func() (bool, string) { return leaseHolder(c, ns) == "ctl-b", leaseHolder(c, ns) })
	takeover := time.Since(killed)
	t.Logf("ctl-b leads %.1fs after ctl-a was killed", takeover.Seconds())
	if takeover > 15*time.Second {
		t.Errorf("takeover took %s, want within 15s", takeover)
	}

	// The new leader adopted both replicas, and the proxies follow it: traffic keeps flowing.
	eventually(t, 30*time.Second, "ctl-b shows the service READY with the same replicas", func() (bool, string) {
		after := replicaInstances(t, b.env)
		return fmt.Sprint(after) == fmt.Sprint(before), fmt.Sprint(after)
	})
	connected := regexp.MustCompile(`connected to the controller.*` + regexp.QuoteMeta(b.url))
	for _, log := range proxyLogs {
		eventually(t, 20*time.Second, "proxy "+log+" follows the new leader", func() (bool, string) {
			raw, err := os.ReadFile(log)
			return err == nil && connected.Match(raw), grepLines(string(raw), "controller")
		})
	}
	atTakeover := load.ok.Load()
	eventually(t, 20*time.Second, "traffic after the takeover", func() (bool, string) {
		return load.ok.Load()-atTakeover >= 50, fmt.Sprint(load.ok.Load() - atTakeover)
	})
	load.stop()
	if n := load.failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed across the failover; first: %v", n, n+load.ok.Load(), load.firstErr.Load())
	}
	t.Logf("%d requests through 2 proxies across the failover, none failed", load.ok.Load())

	if got := instanceDirs(t, shared); fmt.Sprint(got) != fmt.Sprint(launched) {
		t.Errorf("instances launched: %v before the failover, %v after: a replica was launched again", launched, got)
	}
	if got := replicaInstances(t, b.env); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Errorf("replicas %v before the failover, %v after", before, got)
	}
	b.mustRun("serve", "down", "ha", "-y")

	// A leader whose Lease is taken over (as by a controller that judged it expired) exits.
	eventually(t, 10*time.Second, "the Lease taken from ctl-b", func() (bool, string) {
		leases := c.Client().CoordinationV1().Leases(ns)
		lease, err := leases.Get(ctx, haLease, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		thief := "thief"
		lease.Spec.HolderIdentity = &thief
		_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	select {
	case <-b.done:
	case <-time.After(30 * time.Second):
		t.Fatal("ctl-b still runs 30s after losing the Lease")
	}
	if code := b.cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("ctl-b exited with 0 after losing the Lease")
	}
	if raw, _ := os.ReadFile(filepath.Join(b.home, "controller.log")); !strings.Contains(string(raw), "leadership lost") {
		t.Errorf("ctl-b's log does not say it lost leadership:\n%s", lastLines(string(raw), 10))
	}
}

// checkFollowerRedirects asks the follower at url for the attach feed and wants 503 naming
// the leader.
func checkFollowerRedirects(t *testing.T, url, leaderURL string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/services/ha/replicaset?wait=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+haToken("proxy.token"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Ferry-Leader") != leaderURL {
		t.Fatalf("the follower's attach feed: HTTP %d, X-Ferry-Leader %q; want 503 and %s", resp.StatusCode, resp.Header.Get("X-Ferry-Leader"), leaderURL)
	}
}

// haToken is the token both controllers share in file name.
func haToken(name string) string { return "ha-e2e-" + name + "-0123456789abcdef" }

// haController is one `ferry controller --leader-elect` process with a home of its own whose
// tokens are the other controllers' and whose local/ is shared.
type haController struct {
	*env
	id, url string
	args    []string
	cmd     *exec.Cmd
	done    chan struct{}
}

func newHAController(t *testing.T, c *testcluster.Cluster, ns, id, sharedLocal string) *haController {
	t.Helper()
	e := &env{t: t, home: shortTempDir(t, "ferry-ha-home-")}
	// One set of tokens for both controllers: a forwarded request carries the caller's.
	for _, name := range []string{"controller.token", "proxy.token"} {
		writeFile(t, filepath.Join(e.home, name), haToken(name)+"\n")
	}
	if err := os.Symlink(sharedLocal, filepath.Join(e.home, "local")); err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	return &haController{env: e, id: id, url: "http://" + listen, args: []string{"controller",
		"--store", "kubernetes", "--kubeconfig", c.Kubeconfig(), "--kube-context", c.Context(), "--namespace", ns,
		"--leader-elect", "--id", id, "--listen", listen, "--gateway", "off", "--metrics-addr", "off",
		"--first-service-port", fmt.Sprint(freePort(t)), "--probe-interval", "1s"}}
}

// start runs the controller, logging to its home's controller.log.
func (h *haController) start() {
	h.t.Helper()
	h.cmd = h.env.cmd(h.args...)
	log, err := os.Create(filepath.Join(h.home, "controller.log"))
	if err != nil {
		h.t.Fatal(err)
	}
	h.cmd.Stdout, h.cmd.Stderr = log, log
	if err := h.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	h.done = make(chan struct{})
	go func() {
		_ = h.cmd.Wait()
		log.Close()
		close(h.done)
	}()
}

// cleanupHA stops both controllers and every replica still running from the shared directory,
// and shows the controllers' logs when the test failed.
func cleanupHA(t *testing.T, shared string, ctls ...*haController) {
	for _, h := range ctls {
		if h.cmd == nil {
			continue
		}
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.done:
		case <-time.After(20 * time.Second):
			_ = h.cmd.Process.Kill()
			<-h.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(h.home, "controller.log"))
			t.Logf("%s controller.log:\n%s", h.id, lastLines(string(b), 80))
		}
	}
	for _, pid := range localPIDs(shared) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// localPIDs are the live processes of the local instances under dir.
func localPIDs(dir string) []int {
	var out []int
	matches, _ := filepath.Glob(filepath.Join(dir, "*", "instance.json"))
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var meta struct {
			PID int `json:"pid"`
		}
		if json.Unmarshal(b, &meta) == nil && meta.PID > 0 && alive(meta.PID) {
			out = append(out, meta.PID)
		}
	}
	return out
}

// replicaInstances maps each READY replica's id to its instance, as the controller of e's
// home reports them.
func replicaInstances(t *testing.T, e *env) map[int]string {
	t.Helper()
	st, err := e.status("ha")
	if err != nil {
		return map[int]string{-1: err.Error()}
	}
	out := map[int]string{}
	for _, r := range st.Replicas {
		if r.Status == "READY" {
			out[r.ID] = r.InstanceID
		}
	}
	return out
}

// instanceDirs lists the instances ever launched in a local directory: each launch makes one
// directory, kept while the instance lives.
func instanceDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && e.Name() != "logs" && e.Name() != "checkpoints" {
			out = append(out, e.Name())
		}
	}
	return out
}

// leaseHolder is the controller Lease's holderIdentity, "" without one.
func leaseHolder(c *testcluster.Cluster, ns string) string {
	lease, err := c.Client().CoordinationV1().Leases(ns).Get(context.Background(), haLease, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// haLoad is a closed loop of requests, two workers per endpoint, until stopped.
type haLoad struct {
	ok, failed atomic.Int64
	firstErr   atomic.Value
	stop       func()
}

func startLoad(client *http.Client, endpoints []string) *haLoad {
	l := &haLoad{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, ep := range endpoints {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Bounded: at most 20000 requests per worker, and the test stops the loop.
				for range 20000 {
					select {
					case <-done:
						return
					default:
					}
					if err := completion(client, ep); err != nil {
						l.failed.Add(1)
						l.firstErr.CompareAndSwap(nil, err)
						continue
					}
					l.ok.Add(1)
				}
			}()
		}
	}
	l.stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	return l
}

// installFencePolicy creates the fencing ValidatingAdmissionPolicy of charts/ferry for ns and
// lease, as the chart would: writes whose term or holder is not the Lease's are refused. (The
// FerryService status policy is not needed: this test declares no FerryService.)
func installFencePolicy(t *testing.T, client kubernetes.Interface, ns, lease string) {
	t.Helper()
	if err := testcluster.InstallFencing(context.Background(), client, ns, lease, testcluster.FenceState); err != nil {
		t.Fatal(err)
	}
}

// shortTempDir is a temporary directory with a short path (Unix sockets live in homes),
// removed when the test ends.
func shortTempDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, string(b))
}

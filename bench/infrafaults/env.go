package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
)

// The infras the driver runs: the machine itself, fake EC2 and Compute Engine in this process
// (their VMs are local processes on loopback addresses of their own), and a real Kubernetes API
// server (internal/testcluster) whose kubelet stand-in runs pods as local processes. Ferry's
// controller reaches the API server through a proxy the driver can stop (testcluster.APIProxy):
// what a client sees while the API server is down for an upgrade.

// Infra names as Ferry writes them.
const (
	infraLocal = "local"
	infraAWS   = "aws"
	infraGCP   = "gcp"
	infraKube  = "kubernetes"
)

// gcpZones are the Compute zones the fake serves and Ferry may use.
var gcpZones = []string{"us-central1-a", "us-central1-b", "us-central1-c"}

// simModel is the model every replica serves.
const simModel = "infrafaults-sim"

// kubeGPU is the product of the test cluster's nodes: the Kubernetes services and jobs ask
// for one, so nothing else lands there.
const kubeGPU = "T4"

// env is everything the scenarios run against.
type env struct {
	opts    options
	f       *servicekit.Ferry
	group   *childproc.Group
	ec2     *fakeec2.Server
	gce     *fakecompute.Server
	gceSrv  *http.Server
	gceAddr string
	cluster *testcluster.Cluster
	// stopKubelet ends the kubelet stand-in and waits for it.
	stopKubelet func()
	apiDoor     *testcluster.APIProxy
	ns          string
	// marks is where job nodes write the time they exit (every infra's nodes are processes on
	// this machine).
	marks string
	// tasks is where the generated task files go.
	tasks string
}

// setup starts the fakes, the test cluster and a FERRY_HOME configured for all of them.
func setup(ctx context.Context, opts options, progress func(string, ...any)) (*env, error) {
	group, err := childproc.NewGroup(filepath.Join(opts.out, "logs"))
	if err != nil {
		return nil, err
	}
	e := &env{opts: opts, group: group, ns: "ferry-infrafaults", marks: filepath.Join(opts.out, "marks"), tasks: filepath.Join(opts.out, "tasks")}
	for _, d := range []string{e.marks, e.tasks} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if e.f, err = servicekit.NewFerry(opts.ferryBin, filepath.Join(opts.out, "home"), "", "off", group); err != nil {
		return nil, err
	}
	e.f.Env = append(e.f.Env, awsEnv...)
	if err := e.startClouds(); err != nil {
		e.close()
		return nil, err
	}
	progress("starting the Kubernetes test cluster (etcd, kube-apiserver, kube-scheduler, kwok)")
	if err := e.startCluster(ctx); err != nil {
		e.close()
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(e.f.Home.Dir, "config.yaml"), []byte(e.config()), 0o600); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// awsEnv gives the controller static credentials for the fake and keeps the SDK off the
// instance metadata service.
var awsEnv = []string{"AWS_ACCESS_KEY_ID=AKIAFERRYFAULTS", "AWS_SECRET_ACCESS_KEY=ferry-faults-secret",
	"AWS_EC2_METADATA_DISABLED=true", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}

func (e *env) startClouds() error {
	vmEnv := []string{"PATH=" + filepath.Dir(e.opts.ferryBin) + string(os.PathListSeparator) + os.Getenv("PATH")}
	var err error
	if e.ec2, err = fakeec2.New(fakeec2.Options{LogDir: filepath.Join(e.opts.out, "logs", "ec2"), Env: vmEnv}); err != nil {
		return err
	}
	e.gce = fakecompute.New(fakecompute.Options{Project: "ferry-infrafaults", Zones: gcpZones, Dir: filepath.Join(e.opts.out, "logs", "gce"), Env: vmEnv})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e.gceAddr = ln.Addr().String()
	e.gceSrv = &http.Server{Handler: e.gce, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.gceSrv.Serve(ln) }()
	return nil
}

func (e *env) startCluster(ctx context.Context) error {
	root, err := testcluster.RepoRoot()
	if err != nil {
		return err
	}
	if e.cluster, err = testcluster.Start(ctx, testcluster.Options{RepoRoot: root, TempDir: e.opts.out}); err != nil {
		return err
	}
	if err := e.cluster.AddGPUNode(ctx, "faults-t4-0", kubeGPU, 8); err != nil {
		return err
	}
	if _, err := e.cluster.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	stop, err := testcluster.BackgroundKubelet(e.cluster, testcluster.KubeletOptions{FerryBin: e.opts.ferryBin, LogDir: filepath.Join(e.opts.out, "logs", "pods")})
	if err != nil {
		return err
	}
	e.stopKubelet = stop
	e.apiDoor, err = e.cluster.StartAPIProxy()
	return err
}

// config is Ferry's config.yaml: every infra enabled, the cluster reached through the door.
func (e *env) config() string {
	return fmt.Sprintf(`aws:
  regions: [us-east-1]
  endpoint: %s
  amis: {us-east-1: ami-0fe771}
gcp:
  project: ferry-infrafaults
  zones: [%s]
  endpoint: http://%s
kubernetes:
  kubeconfig: %s
  contexts:
    - name: %s
      namespace: %s
`, e.ec2.URL(), strings.Join(gcpZones, ", "), e.gceAddr, e.apiDoor.Kubeconfig(), e.cluster.Context(), e.ns)
}

// close stops everything setup started; the controller and what it launched go first.
func (e *env) close() {
	if e.f != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, _ = e.f.Run(ctx, "controller-stop", 30*time.Second, "controller", "stop")
		cancel()
	}
	if e.group != nil {
		e.group.Close()
	}
	if e.stopKubelet != nil {
		e.stopKubelet()
	}
	if e.apiDoor != nil {
		e.apiDoor.Close()
	}
	if e.cluster != nil {
		e.cluster.Stop()
	}
	if e.gceSrv != nil {
		_ = e.gceSrv.Close()
	}
	if e.gce != nil {
		e.gce.Close()
	}
	if e.ec2 != nil {
		_ = e.ec2.Close()
	}
}

// client is an API client for the controller running now.
func (e *env) client() (*api.Client, error) {
	info, err := e.f.Home.ReadInfo()
	if err != nil {
		return nil, err
	}
	tok, err := os.ReadFile(e.f.Home.TokenPath())
	if err != nil {
		return nil, err
	}
	return api.ClientFor(e.f.Home, info, strings.TrimSpace(string(tok)))
}

// service is one service as the controller reports it.
func (e *env) service(ctx context.Context, name string) (api.ServiceStatus, error) {
	c, err := e.client()
	if err != nil {
		return api.ServiceStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := c.Services(ctx, name)
	if err != nil {
		return api.ServiceStatus{}, err
	}
	if len(list) != 1 {
		return api.ServiceStatus{}, fmt.Errorf("service %q: %d in the answer", name, len(list))
	}
	return list[0], nil
}

// services asks the controller for every service, as `serve status` does.
func (e *env) services(ctx context.Context) error {
	c, err := e.client()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = c.Services(ctx)
	return err
}

// job is one job as the controller reports it.
func (e *env) job(ctx context.Context, ref string) (api.JobStatus, error) {
	c, err := e.client()
	if err != nil {
		return api.JobStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.Job(ctx, ref)
}

// serviceTask is a one-replica service on infra: replica-sim on local and the clouds' VMs, a
// GPU pod on the cluster (the kubelet stand-in runs replica-sim for it).
func serviceTask(name, infra string) string {
	res := "  infra: " + infra + "\n"
	if infra == infraKube {
		// The kubelet stand-in runs replica-sim itself, with these arguments.
		res += "  accelerators: " + kubeGPU + ":1\nenvs:\n  " + testcluster.ReplicaSimArgsEnv + ": --model " + simModel + "\n"
	}
	return fmt.Sprintf(`name: %s
resources:
%sservice:
  readiness_probe:
    path: /health
    initial_delay_seconds: 120
  replicas: 1
  ports: 8080
run: ferry replica-sim --port ${FERRY_PORT:-8080} --model %s
`, name, res, simModel)
}

// jobTask is a job of nodes on infra whose nodes each write the time they exit to the marks
// directory after sleeping sleep (a long sleep is a job that runs until cancelled).
func (e *env) jobTask(name, infra string, nodes int, sleep time.Duration) string {
	res := "  infra: " + infra + "\n"
	if infra == infraKube {
		res += "  accelerators: " + kubeGPU + ":1\n"
	}
	mark := filepath.Join(e.marks, name)
	return fmt.Sprintf(`name: %s
num_nodes: %d
resources:
%srun: |
  sleep %d
  date +%%s.%%N > %s-$SKYPILOT_NODE_RANK
  echo done
`, name, nodes, res, int(sleep.Seconds()), mark)
}

// writeTask writes a task file and returns its path.
func (e *env) writeTask(name, content string) (string, error) {
	path := filepath.Join(e.tasks, name+".yaml")
	return path, os.WriteFile(path, []byte(content), 0o644)
}

// up brings a service up (serve up returns once it is submitted) and returns how long until it
// was READY, within limit.
func (e *env) up(ctx context.Context, name, infra string, limit time.Duration) (time.Duration, error) {
	path, err := e.writeTask(name, serviceTask(name, infra))
	if err != nil {
		return 0, err
	}
	began := time.Now()
	if _, err := e.f.Run(ctx, "up-"+name, limit, "serve", "up", path, "-y"); err != nil {
		return 0, err
	}
	return e.waitReady(ctx, name, began, limit)
}

// waitReady waits until name has a READY replica, at most limit after began.
func (e *env) waitReady(ctx context.Context, name string, began time.Time, limit time.Duration) (time.Duration, error) {
	last := ""
	for time.Since(began) < limit {
		st, err := e.service(ctx, name)
		switch {
		case err != nil:
			last = err.Error()
		case st.ReadyReplicas > 0:
			return time.Since(began), nil
		default:
			last = replicaStates(st)
		}
		if err := sleep(ctx, pollEvery); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("%s not READY within %v (last: %s)", name, limit, last)
}

// replicaStates says where a service's replicas stand, for errors.
func replicaStates(st api.ServiceStatus) string {
	var parts []string
	for _, r := range st.Replicas {
		parts = append(parts, fmt.Sprintf("%d %s %s", r.ID, r.Status, r.Reason))
	}
	return fmt.Sprintf("%s: %s", st.Status, strings.Join(parts, "; "))
}

// launchJob submits a job and returns its id.
func (e *env) launchJob(ctx context.Context, name, content string) (string, error) {
	path, err := e.writeTask(name, content)
	if err != nil {
		return "", err
	}
	if _, err := e.f.Run(ctx, "job-"+name, cliTimeout, "jobs", "launch", path, "-y", "-d"); err != nil {
		return "", err
	}
	j, err := e.job(ctx, name)
	if err != nil {
		return "", err
	}
	return fmt.Sprint(j.ID), nil
}

// waitJob waits until job ref is in one of states, at most limit, and returns it.
func (e *env) waitJob(ctx context.Context, ref string, limit time.Duration, states ...jobs.State) (api.JobStatus, error) {
	deadline := time.Now().Add(limit)
	var j api.JobStatus
	var err error
	for time.Now().Before(deadline) {
		if j, err = e.job(ctx, ref); err == nil && slices.Contains(states, j.State) {
			return j, nil
		}
		if err := sleep(ctx, pollEvery); err != nil {
			return j, err
		}
	}
	return j, fmt.Errorf("job %s not %v within %v (last: %s %s, %v)", ref, states, limit, j.State, j.Reason, err)
}

// lastExit is when the last node of a finished job wrote its mark.
func (e *env) lastExit(name string, nodes int) (time.Time, error) {
	var last time.Time
	for rank := range nodes {
		b, err := os.ReadFile(filepath.Join(e.marks, fmt.Sprintf("%s-%d", name, rank)))
		if err != nil {
			return time.Time{}, err
		}
		var sec, nsec int64
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d.%d", &sec, &nsec); err != nil {
			return time.Time{}, fmt.Errorf("mark of %s rank %d: %q: %w", name, rank, b, err)
		}
		if t := time.Unix(sec, nsec); t.After(last) {
			last = t
		}
	}
	return last, nil
}

// live lists what the infra itself holds of a service or job (selector: a Ferry label):
// instances that are not terminated, as the infra's own fake or API server has them.
func (e *env) live(ctx context.Context, infra string, key, value string) ([]string, error) {
	var out []string
	switch infra {
	case infraAWS:
		for _, in := range e.ec2.Instances() {
			if in.Tags[key] == value && in.State != "terminated" && in.State != "shutting-down" {
				out = append(out, "aws/"+in.Region+"/"+in.ID)
			}
		}
	case infraGCP:
		for _, vm := range e.gce.VMs() {
			if vm.Labels[gcpLabel(key)] == value && vm.Status != "TERMINATED" && vm.Status != "STOPPED" {
				out = append(out, "gcp/"+vm.Zone+"/"+vm.Name)
			}
		}
	case infraKube:
		pods, err := e.cluster.Client().CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: key + "=" + value})
		if err != nil {
			return nil, err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				out = append(out, "kubernetes/"+p.Name)
			}
		}
	default:
		return nil, fmt.Errorf("no listing for infra %q", infra)
	}
	return out, nil
}

// gcpLabel is a Ferry label as GCP keeps it (no dots in label keys).
func gcpLabel(key string) string { return strings.ReplaceAll(key, ".", "-") }

// killController SIGKILLs the controller and starts it again through the CLI.
func (e *env) killController(ctx context.Context) error {
	pid, err := e.f.ControllerPID()
	if err != nil {
		return err
	}
	if pid == 0 {
		return errors.New("no controller running")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	for servicekit.Alive(pid) {
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	_, err = e.f.Run(ctx, "restart", cliTimeout, "serve", "status")
	return err
}

// ownerLabel is the label a service's or job's instances carry.
func ownerLabel(job bool) string {
	if job {
		return launcher.LabelJob
	}
	return launcher.LabelService
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

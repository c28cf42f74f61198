package testcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// ReplicaSimArgsEnv is the container environment variable whose value (split on white space) the
// kubelet stand-in appends to `ferry replica-sim --host <pod IP> --port <container port>`.
const ReplicaSimArgsEnv = "REPLICA_SIM_ARGS"

// KubeletOptions configure a Kubelet.
type KubeletOptions struct {
	// FerryBin is the ferry binary whose `replica-sim` runs each pod that is not a job's.
	// Without it (and without InProcessReplicas) only job pods run anything.
	FerryBin string

	// InProcessReplicas serves each pod that is not a job's in the stand-in's own process
	// instead: the same `replica-sim` command line and environment, parsed as the command
	// parses them, one listener on the pod's IP and port, stopped when the pod goes as the
	// process would be. A replica-sim process takes about 66 MiB; this takes a few hundred
	// KiB a pod, so a thousand replica pods fit on one machine. Job pods still run processes.
	InProcessReplicas bool

	// LogDir receives one log per pod, <namespace>_<name>.log. Default: <cluster dir>/pods.
	LogDir string

	// StopGrace is how long a replica has to exit after SIGTERM before it gets SIGKILL, and
	// how long a job pod's process gets when the stand-in itself stops. (A job pod deleted
	// while the stand-in runs gets its own grace period.) Default: 2 seconds.
	StopGrace time.Duration
}

// Kubelet stands in for the kubelet on the cluster's kwok nodes: kwok marks pods Running with a
// loopback IP, and Kubelet makes that true by running a process for each. It watches pods (an
// informer, not polling) and, for every pod bound to a kwok node that is Running with an IP and
// not being deleted, runs one process.
//
// A job's pod (labelled launcher.LabelJob) runs its first container's command and args on the
// host, as a kubelet runs a container: see jobpods.go for what is resolved and what is not.
// When the process exits the pod's status says so (Succeeded or Failed, with the container's
// exit code); when the pod is deleted the process gets SIGTERM, then SIGKILL after the
// deletion's grace period. It is never started twice.
//
// Any other pod runs, when FerryBin is set (or in this process with InProcessReplicas),
//
//	<FerryBin> replica-sim --host <pod IP> --port <first containerPort of the first container> $REPLICA_SIM_ARGS
//
// with the first container's literal env values added to the environment. When the pod is
// deleted or leaves Running, the replica gets SIGTERM (SIGKILL after StopGrace). A replica that
// exits by itself is not restarted: Running stops listing it, as a crashed container would be.
//
// It also binds PersistentVolumeClaims to host directories (volumes.go), as a provisioner and
// the volume controller would, and serves the kubelet's /containerLogs endpoint on the nodes'
// kubelet port, so that pod logs read through the API server work (containerlogs.go). Run one
// Kubelet per cluster at a time: a second cannot take the port.
type Kubelet struct {
	cluster *Cluster
	opts    KubeletOptions
	synced  chan struct{} // closed once the informers have synced

	// Set by Start.
	pods corelisters.PodLister
	pvcs corelisters.PersistentVolumeClaimLister
	pvs  corelisters.PersistentVolumeLister

	mu       sync.Mutex
	replicas map[string]*replica // by pod key, namespace/name
	// deletionGrace is the grace period the first deletion of a pod asked for, by pod UID:
	// kwok deletes pods at once, so the pod is often gone before its process is stopped.
	deletionGrace map[types.UID]time.Duration
	stopping      sync.WaitGroup      // job processes being stopped in the background
	ending        map[*replica]string // those processes, with their pod's key
	// starting holds the keys of pods whose process is being started: from before a job
	// pod's started marker is written (or a log file created) until the process is in
	// replicas. A follow of their log waits on through it (followable).
	starting map[string]bool
}

// replica is the process run for one pod, and what it was started from.
type replica struct {
	podUID types.UID
	spec   replicaSpec
	proc   runner
	// job is set for a job pod's process.
	job *jobProcess
}

// replicaSpec is what a pod asks to run. Two equal specs run the same process.
type replicaSpec struct {
	args []string
	env  []string
}

func (s replicaSpec) equal(o replicaSpec) bool {
	return slices.Equal(s.args, o.args) && slices.Equal(s.env, o.env)
}

// NewKubelet returns a kubelet stand-in for the cluster; Start runs it.
func NewKubelet(c *Cluster, opts KubeletOptions) (*Kubelet, error) {
	if opts.LogDir == "" {
		opts.LogDir = filepath.Join(c.Dir(), "pods")
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = 2 * time.Second
	}
	if err := os.MkdirAll(opts.LogDir, 0o755); err != nil {
		return nil, err
	}
	return &Kubelet{
		cluster: c, opts: opts, synced: make(chan struct{}),
		replicas: map[string]*replica{}, deletionGrace: map[types.UID]time.Duration{},
		ending: map[*replica]string{}, starting: map[string]bool{},
	}, nil
}

// RunKubelet runs a kubelet stand-in until ctx ends: NewKubelet followed by Start.
func RunKubelet(ctx context.Context, c *Cluster, opts KubeletOptions) error {
	k, err := NewKubelet(c, opts)
	if err != nil {
		return err
	}
	return k.Start(ctx)
}

// StartKubelet runs a kubelet stand-in in the background for the rest of the test, and returns
// once it has seen every pod that exists. Cleanup stops it and waits until its replicas are gone.
func StartKubelet(t testing.TB, c *Cluster, opts KubeletOptions) *Kubelet {
	t.Helper()
	k, err := NewKubelet(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("kubelet stand-in: %v", err)
		}
	})
	select {
	case <-k.synced:
		return k
	case err := <-done:
		done <- err // for Cleanup
		t.Fatalf("kubelet stand-in: %v", err)
		return nil
	}
}

// BackgroundKubelet starts a kubelet stand-in for c in the background, for a bench driver (a
// test has StartKubelet); stop ends it and waits until its replicas are stopped.
func BackgroundKubelet(c *Cluster, opts KubeletOptions) (stop func(), err error) {
	k, err := NewKubelet(c, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = k.Start(ctx)
	}()
	return func() { cancel(); <-done }, nil
}

// Start runs the kubelet stand-in until ctx ends, then stops every replica and returns ctx's
// error. It returns early only if its informers cannot start or the kubelet port is taken.
func (k *Kubelet) Start(ctx context.Context) (err error) {
	logServer, err := k.listenLogs()
	if err != nil {
		return err
	}
	defer logServer.Close()

	factory := informers.NewSharedInformerFactory(k.cluster.Client(), 0)
	podInformer := factory.Core().V1().Pods()
	nodeInformer := factory.Core().V1().Nodes()
	pvcInformer := factory.Core().V1().PersistentVolumeClaims()
	pvInformer := factory.Core().V1().PersistentVolumes()
	pods, nodes := podInformer.Lister(), nodeInformer.Lister()
	k.pvcs, k.pvs, k.pods = pvcInformer.Lister(), pvInformer.Lister(), pods

	queue := workqueue.NewTyped[string]()
	enqueuePod := func(obj any) {
		if pod := podOf(obj); pod != nil && isJobPod(pod) && pod.DeletionTimestamp != nil && pod.DeletionGracePeriodSeconds != nil {
			k.noteDeletion(pod.UID, time.Duration(*pod.DeletionGracePeriodSeconds)*time.Second)
		}
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	// A pod's fate also depends on its node: whether kwok runs it, and whether it still exists.
	enqueueNodePods := func(obj any) {
		node, ok := obj.(*corev1.Node)
		if !ok {
			tombstone, isTombstone := obj.(cache.DeletedFinalStateUnknown)
			if !isTombstone {
				return
			}
			if node, ok = tombstone.Obj.(*corev1.Node); !ok {
				return
			}
		}
		all, _ := pods.List(labels.Everything())
		for _, pod := range all {
			if pod.Spec.NodeName == node.Name {
				enqueuePod(pod)
			}
		}
	}
	// A job pod waits for its claims to be bound; claims are bound here too.
	claimQueue := workqueue.NewTyped[string]()
	enqueueClaim := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			claimQueue.Add(key)
		}
		all, _ := pods.List(labels.Everything())
		for _, pod := range all {
			enqueuePod(pod)
		}
	}
	for informer, handler := range map[cache.SharedIndexInformer]cache.ResourceEventHandlerFuncs{
		podInformer.Informer():  {AddFunc: enqueuePod, UpdateFunc: func(_, obj any) { enqueuePod(obj) }, DeleteFunc: enqueuePod},
		nodeInformer.Informer(): {AddFunc: enqueueNodePods, UpdateFunc: func(_, obj any) { enqueueNodePods(obj) }, DeleteFunc: enqueueNodePods},
		pvcInformer.Informer():  {AddFunc: enqueueClaim, UpdateFunc: func(_, obj any) { enqueueClaim(obj) }, DeleteFunc: k.releaseClaim},
	} {
		if _, err := informer.AddEventHandler(handler); err != nil {
			return err
		}
	}
	_ = pvInformer.Informer() // registered before Start, for the claims' volumes

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	defer k.stopAll()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("kubelet stand-in: %v informer did not sync: %w", typ, context.Cause(ctx))
		}
	}

	requeue := func(key string) {
		time.AfterFunc(500*time.Millisecond, func() { queue.Add(key) })
	}
	var workers sync.WaitGroup
	workers.Go(func() {
		for {
			key, shutdown := queue.Get()
			if shutdown {
				return
			}
			k.sync(ctx, key, pods, nodes, requeue)
			queue.Done(key)
		}
	})
	workers.Go(func() {
		for {
			key, shutdown := claimQueue.Get()
			if shutdown {
				return
			}
			if k.bindClaim(ctx, key) != nil {
				time.AfterFunc(500*time.Millisecond, func() { claimQueue.Add(key) })
			}
			claimQueue.Done(key)
		}
	})
	go func() { _ = logServer.serve() }()
	close(k.synced)
	<-ctx.Done()
	queue.ShutDown()
	claimQueue.ShutDown()
	workers.Wait()
	return ctx.Err()
}

// podOf is the pod of an informer event, also from a deletion's tombstone.
func podOf(obj any) *corev1.Pod {
	if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	pod, _ := obj.(*corev1.Pod)
	return pod
}

// noteDeletion remembers the grace period the first deletion of a pod asked for.
func (k *Kubelet) noteDeletion(uid types.UID, grace time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, seen := k.deletionGrace[uid]; !seen {
		k.deletionGrace[uid] = grace
	}
}

// sync brings the process of one pod in line with the pod: a pure decision, then the action.
func (k *Kubelet) sync(ctx context.Context, key string, pods corelisters.PodLister, nodes corelisters.NodeLister, requeue func(string)) {
	var pod *corev1.Pod
	var node *corev1.Node
	if ns, name, err := cache.SplitMetaNamespaceKey(key); err == nil {
		pod, _ = pods.Pods(ns).Get(name) // listers fail only with NotFound
	}
	if pod != nil && pod.Spec.NodeName != "" {
		node, _ = nodes.Get(pod.Spec.NodeName)
	}
	k.mu.Lock()
	current := k.replicas[key]
	k.mu.Unlock()
	if (current != nil && current.job != nil) || (pod != nil && isJobPod(pod)) {
		k.syncJob(ctx, key, pod, node, current, requeue)
		return
	}
	want, run := desiredReplica(pod, node)
	if run && k.opts.FerryBin == "" && !k.opts.InProcessReplicas {
		run = false
	}
	if current != nil {
		if run && current.podUID == pod.UID && current.spec.equal(want) {
			return
		}
		current.proc.stop(k.opts.StopGrace)
		k.mu.Lock()
		delete(k.replicas, key)
		k.mu.Unlock()
	}
	if !run {
		return
	}
	defer k.markStarting(key)()
	logPath := k.LogPath(pod.Namespace, pod.Name)
	var proc runner
	var err error
	if k.opts.InProcessReplicas {
		proc, err = startInProcess(logPath, want.env, want.args)
	} else {
		proc, err = startProcess("replica of pod "+key, logPath, append(os.Environ(), want.env...), k.opts.FerryBin, want.args...)
	}
	if err != nil {
		// Like a container that cannot start: the pod stays without a replica. The log says why.
		_ = os.WriteFile(logPath, []byte(err.Error()+"\n"), 0o644)
		return
	}
	k.mu.Lock()
	k.replicas[key] = &replica{podUID: pod.UID, spec: want, proc: proc}
	k.mu.Unlock()
}

// desiredReplica decides whether a pod should have a replica and with which command line and
// environment. node is the pod's node, nil when the pod is unbound or its node is gone.
func desiredReplica(pod *corev1.Pod, node *corev1.Node) (replicaSpec, bool) {
	if pod == nil || node == nil || pod.DeletionTimestamp != nil ||
		node.Annotations[KwokNodeAnnotation] != "fake" ||
		pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" ||
		len(pod.Spec.Containers) == 0 || len(pod.Spec.Containers[0].Ports) == 0 {
		return replicaSpec{}, false
	}
	container := pod.Spec.Containers[0]
	spec := replicaSpec{args: []string{
		"replica-sim",
		"--host", pod.Status.PodIP,
		"--port", strconv.Itoa(int(container.Ports[0].ContainerPort)),
	}}
	for _, env := range container.Env {
		if env.ValueFrom != nil {
			continue // only literal values; there is no API machinery to resolve the rest
		}
		spec.env = append(spec.env, env.Name+"="+env.Value)
		if env.Name == ReplicaSimArgsEnv {
			spec.args = append(spec.args, strings.Fields(env.Value)...)
		}
	}
	if args, ok := ferryArgs(pod); ok { // another ferry command (ferryargs.go)
		spec.args = args
	}
	return spec, true
}

// Running returns the keys (namespace/name) of the pods whose process is alive, sorted: also
// a deleted job pod's, until its process has exited within its grace period.
func (k *Kubelet) Running() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var keys []string
	for key, r := range k.replicas {
		if !r.proc.exited() {
			keys = append(keys, key)
		}
	}
	for r, key := range k.ending {
		if !r.proc.exited() && !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	slices.Sort(keys)
	return keys
}

// LogPath is where the replica of the pod namespace/name logs.
func (k *Kubelet) LogPath(namespace, name string) string {
	return filepath.Join(k.opts.LogDir, namespace+"_"+name+".log")
}

// stopAll stops every replica and job process, in parallel, and waits for them and for the
// job processes already being stopped.
func (k *Kubelet) stopAll() {
	k.mu.Lock()
	replicas := k.replicas
	k.replicas = map[string]*replica{}
	k.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range replicas {
		if r.job != nil {
			r.job.stopping.Store(true)
		}
		wg.Go(func() { r.proc.stop(k.opts.StopGrace) })
	}
	wg.Wait()
	k.stopping.Wait()
}

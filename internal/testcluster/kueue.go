package testcluster

import (
	"context"
	"crypto/tls"
	_ "embed"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
)

// Kueue stands in for Kueue's plain-pod integration in one namespace, against the real API
// server:
//
//   - a real mutating admission webhook (HTTPS on loopback, registered with a
//     MutatingWebhookConfiguration for the namespace's pods labelled kueue.x-k8s.io/queue-name)
//     adds the scheduling gate kueue.x-k8s.io/admission to each such pod at creation, as
//     Kueue's pod webhook does;
//   - an admission loop lifts the gates of a pod group (kueue.x-k8s.io/pod-group-name) once all
//     kueue.x-k8s.io/pod-group-total-count pods exist and their nvidia.com/gpu fit the queue's
//     quota beside the groups it admitted that have not ended — Kueue's quota check, for one
//     ClusterQueue with one flavour.
//
// It proves that Ferry's pods carry what Kueue's pod integration reads, that Ferry waits while
// they are gated and runs the group once they are not. It does not do what only Kueue does:
// Workload objects, ClusterQueues, cohorts, preemption, priorities, admission checks (Kueue's
// own ProvisioningRequests), or the finalizer Kueue puts on its pods.

// The labels, annotation and gate the stand-in reads (Kueue's names).
const (
	kueueGate        = "kueue.x-k8s.io/admission"
	kueueQueueLabel  = "kueue.x-k8s.io/queue-name"
	kueueGroupLabel  = "kueue.x-k8s.io/pod-group-name"
	kueueGroupCount  = "kueue.x-k8s.io/pod-group-total-count"
	kueueWebhookPath = "/mutate-pod"
)

var localQueueGVR = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta1", Resource: "localqueues"}

//go:embed crds/localqueues.yaml
var localQueueCRD []byte

// KueueOptions configure StartKueue.
type KueueOptions struct {
	// Namespace is the one namespace the stand-in manages; LocalQueue is created there.
	Namespace  string
	LocalQueue string
	// GPUQuota is the nvidia.com/gpu the admitted groups may hold at once.
	GPUQuota int64
}

// Kueue is the running stand-in.
type Kueue struct {
	c    *Cluster
	opts KueueOptions

	mu       sync.Mutex
	admitted map[string]int64 // group → its GPUs, while any of its pods has not ended
	events   []string
}

// StartKueue installs the LocalQueue CRD, creates the LocalQueue, registers the webhook and
// starts the admission loop, all undone when the test ends.
func StartKueue(t testing.TB, c *Cluster, opts KueueOptions) *Kueue {
	t.Helper()
	ctx := context.Background()
	if err := c.installCRD(ctx, localQueueCRD, localQueueGVR); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	lq := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
		"metadata": map[string]any{"name": opts.LocalQueue}, "spec": map[string]any{"clusterQueue": "cluster-queue"},
	}}
	if _, err := dyn.Resource(localQueueGVR).Namespace(opts.Namespace).Create(ctx, lq, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k := &Kueue{c: c, opts: opts, admitted: map[string]int64{}}
	stop, err := k.serveWebhook(ctx)
	if err != nil {
		t.Fatal(err)
	}
	loopCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { k.admitLoop(loopCtx) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		stop()
	})
	return k
}

// serveWebhook starts the HTTPS webhook and registers it; stop unregisters and closes it.
func (k *Kueue) serveWebhook(ctx context.Context) (stop func(), err error) {
	cert, err := selfSignedCert()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc(kueueWebhookPath, k.mutate)
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	name := "ferry-test-kueue-" + k.opts.Namespace
	url := "https://" + ln.Addr().String() + kueueWebhookPath
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	timeout := int32(10)
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "pods.kueue-stand-in.ferry.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": k.opts.Namespace}},
			ObjectSelector:          &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: kueueQueueLabel, Operator: metav1.LabelSelectorOpExists}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	api := k.c.client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := api.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		_ = srv.Close()
		return nil, err
	}
	stop = func() {
		_ = api.Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = srv.Close()
	}
	if err := k.waitWebhook(ctx); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// waitWebhook waits until the API server calls the webhook (it loads configurations
// asynchronously): a dry-run pod with the queue label comes back gated.
func (k *Kueue) waitWebhook(ctx context.Context) error {
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kueue-webhook-probe", Labels: map[string]string{kueueQueueLabel: k.opts.LocalQueue}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}},
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := k.c.client.CoreV1().Pods(k.opts.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && isGated(*got), nil
	})
}

// mutate answers an AdmissionReview for a pod: the gate added, as a JSON patch.
func (k *Kueue) mutate(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	var review admissionv1.AdmissionReview
	if err == nil {
		err = json.Unmarshal(body, &review)
	}
	if err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	var pod corev1.Pod
	resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	if err := json.Unmarshal(review.Request.Object.Raw, &pod); err == nil && !slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == kueueGate }) {
		op := map[string]any{"op": "add", "path": "/spec/schedulingGates/-", "value": map[string]string{"name": kueueGate}}
		if len(pod.Spec.SchedulingGates) == 0 {
			op = map[string]any{"op": "add", "path": "/spec/schedulingGates", "value": []map[string]string{{"name": kueueGate}}}
		}
		patch, _ := json.Marshal([]any{op})
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
		k.record("gated pod %s of group %s", pod.Name, pod.Labels[kueueGroupLabel])
	}
	review.Response = resp
	out, _ := json.Marshal(review)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// admitLoop admits complete groups that fit the quota, every 100ms until ctx ends.
func (k *Kueue) admitLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if err := k.admitPass(ctx); err != nil && ctx.Err() == nil {
			k.record("admission pass: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (k *Kueue) admitPass(ctx context.Context) error {
	pods, err := k.c.client.CoreV1().Pods(k.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kueueGroupLabel})
	if err != nil {
		return err
	}
	groups := map[string][]corev1.Pod{}
	for _, pod := range pods.Items {
		groups[pod.Labels[kueueGroupLabel]] = append(groups[pod.Labels[kueueGroupLabel]], pod)
	}
	k.mu.Lock()
	var held int64
	for name := range k.admitted {
		if !slices.ContainsFunc(groups[name], func(p corev1.Pod) bool {
			return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
		}) {
			delete(k.admitted, name) // ended or deleted: its quota is free
			continue
		}
		held += k.admitted[name]
	}
	k.mu.Unlock()
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(groups)) {
		members := groups[name]
		want, _ := strconv.Atoi(members[0].Annotations[kueueGroupCount])
		if len(members) != want || !slices.ContainsFunc(members, isGated) {
			continue
		}
		gpus := int64(0)
		for _, p := range members {
			for _, c := range p.Spec.Containers {
				if q, ok := c.Resources.Requests[GPUResource]; ok {
					gpus += q.Value()
				}
			}
		}
		if held+gpus > k.opts.GPUQuota {
			continue
		}
		for _, p := range members {
			_, err := k.c.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/spec/schedulingGates"}]`), metav1.PatchOptions{})
			errs = append(errs, err)
		}
		held += gpus
		k.mu.Lock()
		k.admitted[name] = gpus
		k.mu.Unlock()
		k.record("admitted group %s (%d GPUs, %d of %d held)", name, gpus, held, k.opts.GPUQuota)
	}
	return errors.Join(errs...)
}

func isGated(p corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == kueueGate })
}

// Events is what the stand-in did, in order.
func (k *Kueue) Events() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.events)
}

func (k *Kueue) record(format string, args ...any) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.events = append(k.events, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

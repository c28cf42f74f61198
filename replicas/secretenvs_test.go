package replicas

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher/kubernetes"
)

const credentialTaskYAML = `run: serve
envs:
  MODEL: plain-model-name
  HF_TOKEN: hf_env_written_token_1
  OPENAI_API_KEY: sk-env-written-key-2
secrets:
  WANDB_API_KEY: wandb-secret-3
resources:
  infra: kubernetes
  accelerators: L4:1
service:
  ports: 8000
`

var credentialValues = []string{"hf_env_written_token_1", "sk-env-written-key-2", "wandb-secret-3"}

// TestReplicaSpecTreatsCredentialEnvsAsSecrets: an env named like a credential is a secret env
// of the replica's spec, beside the task's secrets, and still in its environment.
func TestReplicaSpecTreatsCredentialEnvsAsSecrets(t *testing.T) {
	task, err := configs.Parse("t.yaml", []byte(credentialTaskYAML), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	spec := replicaSpec("chat", 1, task, 1, false)
	if diff := cmp.Diff([]string{"HF_TOKEN", "OPENAI_API_KEY", "WANDB_API_KEY"}, spec.SecretEnvs); diff != "" {
		t.Errorf("SecretEnvs (-want +got):\n%s", diff)
	}
	if spec.Envs["HF_TOKEN"] != "hf_env_written_token_1" || spec.Envs["MODEL"] != "plain-model-name" {
		t.Errorf("the replica's environment lost its envs: %v", spec.Envs)
	}
}

var secretEnvsNS atomic.Int64

// TestCredentialEnvsReachPodsThroughSecrets: on a real API server, a replica pod built from a
// task whose envs hold HF_TOKEN and OPENAI_API_KEY, and whose secrets hold WANDB_API_KEY,
// carries all three only as references to its Secret, which holds them; no pod spec and no
// ConfigMap of the namespace holds a value. (launcher/kubernetes's job tests show a
// secretKeyRef reaching the program's environment.)
func TestCredentialEnvsReachPodsThroughSecrets(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "rs-secret-l4-0", "NVIDIA-L4", 1); err != nil {
		t.Fatal(err)
	}
	ns := "rsec-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + "-" + strconv.FormatInt(secretEnvsNS.Add(1), 10)
	if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client().CoreV1().Pods(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = c.Client().CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	p, err := kubernetes.New(kubernetes.Options{Kubeconfig: c.Kubeconfig(), Context: c.Context(), Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)

	task, err := configs.Parse("t.yaml", []byte(credentialTaskYAML), configs.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := p.Launch(ctx, replicaSpec("chat", 1, task, 1, false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Terminate(context.Background(), inst.ID) })

	pod, err := c.Client().CoreV1().Pods(ns).Get(ctx, inst.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(pod)
	secretName := ""
	for _, e := range pod.Spec.Containers[0].Env {
		switch e.Name {
		case "HF_TOKEN", "OPENAI_API_KEY", "WANDB_API_KEY":
			if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
				t.Errorf("env %s: %+v; want only a secretKeyRef", e.Name, e)
				continue
			}
			secretName = e.ValueFrom.SecretKeyRef.Name
		case "MODEL":
			if e.Value != "plain-model-name" {
				t.Errorf("MODEL = %q, want it inline", e.Value)
			}
		}
	}
	sec, err := c.Client().CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod's Secret %q: %v", secretName, err)
	}
	for k, want := range map[string]string{"HF_TOKEN": credentialValues[0], "OPENAI_API_KEY": credentialValues[1], "WANDB_API_KEY": credentialValues[2]} {
		if got := string(sec.Data[k]); got != want {
			t.Errorf("Secret %s[%s] = %q, want %q", secretName, k, got, want)
		}
	}
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rawCMs, _ := json.Marshal(cms)
	for _, v := range credentialValues {
		if strings.Contains(string(raw), v) {
			t.Errorf("the pod holds %q", v)
		}
		if strings.Contains(string(rawCMs), v) {
			t.Errorf("a ConfigMap of the namespace holds %q", v)
		}
	}
}

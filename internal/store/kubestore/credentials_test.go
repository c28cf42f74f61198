package kubestore_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/replicas"
)

// TestCredentialEnvsStayInSecrets: an env named like a credential (HF_TOKEN, AWS_SECRET_ACCESS_KEY
// written under envs) is kept as a secret is: no ConfigMap of the state holds its value, through
// a create, an update and a job (the sealed ones hold it encrypted), and the store reads it back.
func TestCredentialEnvsStayInSecrets(t *testing.T) {
	c := testcluster.Shared(t)
	ns := newNamespace(t, c)
	s := opener(c, ns)(t)
	values := []string{"hf_env_cred_v1", "aws/env+cred/v2", "hf_env_cred_job"}
	task := func(run, token string) *configs.Task {
		return &configs.Task{Run: run, Envs: map[string]string{"MODEL": "m", "HF_TOKEN": token, "AWS_SECRET_ACCESS_KEY": values[1]}}
	}
	if err := s.CreateService(store.Service{Name: "chat", Version: 1, Task: task("v1", values[0]), Port: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUpdate("chat", replicas.Version{Number: 2, LaunchedAs: 2, Task: task("v2", values[0])}, replicas.Rollout{From: 1, To: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateJob(jobs.Job{Name: "train", Task: task("train", values[2]), State: jobs.Pending}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: kubestore.LabelManagedBy + "=" + kubestore.ManagedBy}
	cms, err := c.Client().CoreV1().ConfigMaps(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		for _, cm := range cms.Items {
			for k, data := range cm.Data {
				if strings.Contains(data, v) {
					t.Errorf("ConfigMap %s key %s holds %q", cm.Name, k, v)
				}
			}
		}
	}
	svc, err := s.GetService("chat")
	if err != nil || svc.Task.Envs["HF_TOKEN"] != values[0] || svc.Task.Envs["AWS_SECRET_ACCESS_KEY"] != values[1] || svc.Task.Run != "v2" {
		t.Errorf("GetService: %+v, %v; want v2 with its HF_TOKEN and AWS_SECRET_ACCESS_KEY", svc.Task, err)
	}
	list, err := s.ListJobs()
	if err != nil || len(list) != 1 || list[0].Task.Envs["HF_TOKEN"] != values[2] {
		t.Errorf("ListJobs: %+v, %v; want the job with its HF_TOKEN", list, err)
	}
}

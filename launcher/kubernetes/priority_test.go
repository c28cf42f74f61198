package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
)

// TestPriorityClassesConfigured: the serving value moves the whole band (jobs keep their
// distance to services), and the cap lowers what would be above it.
func TestPriorityClassesConfigured(t *testing.T) {
	service := launcher.Spec{Labels: map[string]string{launcher.LabelService: "svc"}}
	job := func(priority int, preemptible bool) launcher.Spec {
		return launcher.Spec{Labels: map[string]string{launcher.LabelJob: "j"}, Job: &launcher.JobSpec{Priority: priority, Preemptible: preemptible}}
	}
	type want struct {
		class string
		value int32
	}
	tests := map[string]struct {
		serving, max *int32
		spec         launcher.Spec
		want         want
	}{
		"service at the default":                   {spec: service, want: want{"ferry-serving", 1000}},
		"service at a configured value":            {serving: new(int32(100)), spec: service, want: want{"ferry-serving-100", 100}},
		"service under a cap alone":                {max: new(int32(10)), spec: service, want: want{"ferry-serving-10", 10}},
		"preemptible job keeps its distance below": {serving: new(int32(100)), spec: job(500, true), want: want{"ferry-job--400", -400}},
		"job above serving keeps its distance":     {serving: new(int32(100)), max: new(int32(5000)), spec: job(2000, false), want: want{"ferry-job-1100", 1100}},
		"job above the cap is lowered to it":       {serving: new(int32(100)), max: new(int32(500)), spec: job(2000, false), want: want{"ferry-job-500", 500}},
		"default job at the default serving":       {spec: job(launcher.DefaultJobPriority, true), want: want{"ferry-job-500", 500}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := New(Options{RESTConfig: &rest.Config{Host: "http://127.0.0.1:1"}, Namespace: "ns", ServingPriority: tt.serving, MaxPriority: tt.max})
			if err != nil {
				t.Fatal(err)
			}
			class, value, _ := p.priorityClassFor(tt.spec)
			if got := (want{class, value}); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	_, err := New(Options{RESTConfig: &rest.Config{Host: "http://127.0.0.1:1"}, ServingPriority: new(int32(600)), MaxPriority: new(int32(500))})
	if !errors.Is(err, launcher.ErrInvalid) {
		t.Errorf("serving above the cap: %v, want ErrInvalid", err)
	}
}

// TestPriorityCapOnTheCluster: under a cap, a service's and a non-preemptible job's pods run
// in classes at most at the cap, which the API server resolves into their priority; a class
// of Ferry's name that someone made above the cap is not used, and the launch says what to do.
func TestPriorityCapOnTheCluster(t *testing.T) {
	c := testcluster.Shared(t)
	ctx := context.Background()
	if err := c.AddGPUNode(ctx, "pc-t4-0", "Tesla-T4", 4); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, c, Options{ServingPriority: new(int32(300)), MaxPriority: new(int32(310))})
	job := jobSpec(t, "pc-job", "T4", "sleep 60")
	job.Job.Priority, job.Job.Preemptible, job.Job.CheckpointClaim = 2000, false, ""
	for spec, want := range map[*launcher.Spec]int32{new(gpuSpec("svc-1", "T4", 1)): 300, &job: 310} {
		inst, err := p.Launch(ctx, *spec)
		if err != nil {
			t.Fatal(err)
		}
		pod := podOf(t, c, p, inst)
		var got int32 = -1
		if pod.Spec.Priority != nil {
			got = *pod.Spec.Priority
		}
		if got != want || pod.Spec.PriorityClassName == "" {
			t.Errorf("%s: class %q priority %d, want %d", spec.Name, pod.Spec.PriorityClassName, got, want)
		}
	}

	// Someone else's class under the name Ferry would use, above the cap.
	never := corev1.PreemptNever
	squatter := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "ferry-serving-200"}, Value: 100000, PreemptionPolicy: &never}
	if _, err := c.Client().SchedulingV1().PriorityClasses().Create(ctx, squatter, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client().SchedulingV1().PriorityClasses().Delete(context.Background(), squatter.Name, metav1.DeleteOptions{})
	})
	capped := newProvider(t, c, Options{ServingPriority: new(int32(200)), MaxPriority: new(int32(250)), ProvisionTimeout: 5 * time.Second})
	_, err := capped.Launch(ctx, gpuSpec("svc-2", "T4", 1))
	if !errors.Is(err, launcher.ErrInvalid) || !strings.Contains(err.Error(), "kubectl delete priorityclass ferry-serving-200") {
		t.Errorf("launch with a class above the cap: %v, want ErrInvalid saying to delete it", err)
	}
	if pods, _ := c.Client().CoreV1().Pods(capped.Namespace()).List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Errorf("%d pods created above the cap", len(pods.Items))
	}
}

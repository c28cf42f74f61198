package configs

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseCapacity(t *testing.T) {
	const head = "run: train\nresources:\n  infra: gcp\n  accelerators: H100:8\n"
	tests := map[string]struct {
		yaml string
		want *Capacity
	}{
		"absent": {yaml: head},
		"queued with waits": {
			yaml: head + "  capacity:\n    mode: queued\n    max_wait: 2h\n    max_run_duration: 90m\n",
			want: &Capacity{Mode: CapacityQueued, MaxWait: 2 * time.Hour, MaxRunDuration: 90 * time.Minute},
		},
		"seconds as a number": {
			yaml: head + "  capacity: {mode: queued, max_wait: 30, max_run_duration: 3600}\n",
			want: &Capacity{Mode: CapacityQueued, MaxWait: 30 * time.Second, MaxRunDuration: time.Hour},
		},
		"days and compound durations": {
			yaml: head + "  capacity: {mode: queued, max_wait: 1d, max_run_duration: 1h30m}\n",
			want: &Capacity{Mode: CapacityQueued, MaxWait: 24 * time.Hour, MaxRunDuration: 90 * time.Minute},
		},
		"reserved defaults to any": {
			yaml: head + "  capacity: {mode: reserved, max_run_duration: 4h}\n",
			want: &Capacity{Mode: CapacityReserved, MaxRunDuration: 4 * time.Hour, Reservation: ReservationAny},
		},
		"a reservation implies reserved": {
			yaml: head + "  capacity: {reservation: cr-0abc12345def67890}\n",
			want: &Capacity{Mode: CapacityReserved, Reservation: "cr-0abc12345def67890"},
		},
		"on_demand with a run limit": {
			yaml: head + "  capacity: {max_run_duration: 45s}\n",
			want: &Capacity{Mode: CapacityOnDemand, MaxRunDuration: 45 * time.Second},
		},
		"queued on local waits in Ferry's own queue": {
			yaml: "run: x\nresources:\n  capacity: {mode: queued, max_wait: 5m}\n",
			want: &Capacity{Mode: CapacityQueued, MaxWait: 5 * time.Minute},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, task.Resources.Capacity); diff != "" {
				t.Errorf("Capacity (-want +got):\n%s", diff)
			}
			again, out := reparse(t, task)
			if diff := cmp.Diff(task.Resources.Capacity, again.Resources.Capacity); diff != "" {
				t.Errorf("round trip (-first +again):\n%s\n%s", diff, out)
			}
		})
	}
}

func TestCapacityAlternativesInherit(t *testing.T) {
	yaml := "run: x\nresources:\n  capacity: {mode: queued, max_wait: 1h}\n  any_of:\n    - {infra: gcp, accelerators: H100:8}\n    - {infra: aws, accelerators: H100:8}\n"
	task, err := Parse("task.yaml", []byte(yaml), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Capacity{Mode: CapacityQueued, MaxWait: time.Hour}
	for i, alt := range task.Resources.AnyOf {
		if diff := cmp.Diff(want, alt.Capacity); diff != "" {
			t.Errorf("any_of[%d] (-want +got):\n%s", i, diff)
		}
	}
	task.Resources.AnyOf[0].Capacity.MaxWait = 0
	if task.Resources.Capacity.MaxWait != time.Hour || task.Resources.AnyOf[1].Capacity.MaxWait != time.Hour {
		t.Error("alternatives share one Capacity with the top level")
	}
	out, err := task.ResolvedYAML()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse("resolved.yaml", out, Overrides{}); err != nil {
		t.Fatalf("resolved YAML does not parse: %v\n%s", err, out)
	}
}

func TestParseCapacityErrors(t *testing.T) {
	const head = "run: train\nresources:\n  infra: aws\n"
	tests := map[string]struct {
		yaml string
		want []wantErr
	}{
		"unknown key": {
			yaml: head + "  capacity: {mode: queued, max_wiat: 1h}\n",
			want: []wantErr{{4, 28, "resources.capacity.max_wiat", `did you mean "max_wait"?`}},
		},
		"unknown mode": {
			yaml: head + "  capacity:\n    mode: queue\n",
			want: []wantErr{{5, 11, "resources.capacity.mode", `did you mean "queued"?`}},
		},
		"bad duration": {
			yaml: head + "  capacity:\n    mode: queued\n    max_wait: 2 hours\n",
			want: []wantErr{{6, 15, "resources.capacity.max_wait", `expected a duration such as "90m"`}},
		},
		"zero duration": {
			yaml: head + "  capacity:\n    max_run_duration: 0\n",
			want: []wantErr{{5, 23, "resources.capacity.max_run_duration", "at least one second"}},
		},
		"sub-second duration": {
			yaml: head + "  capacity:\n    max_run_duration: 1500ms\n",
			want: []wantErr{{5, 23, "resources.capacity.max_run_duration", "expected a duration"}},
		},
		"too long": {
			yaml: head + "  capacity:\n    max_run_duration: 400d\n",
			want: []wantErr{{5, 23, "resources.capacity.max_run_duration", "out of range"}},
		},
		"negative": {
			yaml: head + "  capacity:\n    mode: queued\n    max_wait: -1h\n",
			want: []wantErr{{6, 15, "resources.capacity.max_wait", "expected a duration"}},
		},
		"list instead of a mapping": {
			yaml: head + "  capacity: [queued]\n",
			want: []wantErr{{4, 13, "resources.capacity", "expected a mapping"}},
		},
		"reservation without reserved": {
			yaml: head + "  capacity:\n    mode: queued\n    reservation: my-block\n",
			want: []wantErr{{6, 5, "resources.capacity.reservation", "reservation needs mode: reserved"}},
		},
		"max_wait on on_demand": {
			yaml: head + "  capacity:\n    max_wait: 1h\n",
			want: []wantErr{{5, 5, "resources.capacity.max_wait", "max_wait is for mode: queued or reserved"}},
		},
		"bad reservation name": {
			yaml: head + "  capacity:\n    reservation: \"my block!\"\n",
			want: []wantErr{{5, 18, "resources.capacity.reservation", "is not a reservation name"}},
		},
		"reserved spot": {
			yaml: head + "  use_spot: true\n  capacity:\n    mode: reserved\n",
			want: []wantErr{{6, 11, "resources.capacity.mode", "reserved capacity is never spot"}},
		},
		"reserved on local": {
			yaml: "run: x\nresources:\n  infra: local\n  capacity:\n    mode: reserved\n",
			want: []wantErr{{5, 11, "resources.capacity.mode", "local has no reservations"}},
		},
		"in an alternative": {
			yaml: head + "  any_of:\n    - {accelerators: L4, capacity: {mode: queued}}\n",
			want: []wantErr{{5, 26, "resources.any_of[0].capacity", "set it once, at the top of resources"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("task.yaml", []byte(tc.yaml), Overrides{})
			if err == nil {
				t.Fatal("Parse succeeded, want errors")
			}
			got := Errors(err)
			if diff := cmp.Diff(tc.want, project(got, tc.want)); diff != "" {
				t.Errorf("errors mismatch (-want +got):\n%s\nfull error:\n%v", diff, err)
			}
		})
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "", 2 * time.Hour: "2h", 90 * time.Minute: "90m", 45 * time.Second: "45s", 48 * time.Hour: "2d"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
		if d > 0 {
			if back, ok := ParseDuration(want); !ok || back != d {
				t.Errorf("ParseDuration(%q) = %v, %v; want %v", want, back, ok, d)
			}
		}
	}
}

func TestFerryConfigQueuedProvisioning(t *testing.T) {
	cfg, err := ParseFerryConfig("config.yaml", []byte(`
kubernetes:
  kueue_local_queue: team-a
  contexts:
    - {name: gke-a3, queued_provisioning: true}
    - {name: other, queued_provisioning: {class: check-capacity.autoscaling.x-k8s.io}}
    - {name: plain, queued_provisioning: false}
    - {name: pools, queued_provisioning: {accelerators: [T4:1, H100:8]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []KubernetesContext{
		{Name: "gke-a3", QueuedProvisioning: &QueuedProvisioning{Class: DefaultProvisioningClass}},
		{Name: "other", QueuedProvisioning: &QueuedProvisioning{Class: "check-capacity.autoscaling.x-k8s.io"}},
		{Name: "plain"},
		{Name: "pools", QueuedProvisioning: &QueuedProvisioning{Class: DefaultProvisioningClass,
			Accelerators: []Accelerator{{Name: "T4", Count: 1}, {Name: "H100", Count: 8}}}},
	}
	if diff := cmp.Diff(want, cfg.Kubernetes.Contexts); diff != "" {
		t.Errorf("contexts (-want +got):\n%s", diff)
	}
	if cfg.Kubernetes.KueueLocalQueue != "team-a" {
		t.Errorf("kueue_local_queue = %q", cfg.Kubernetes.KueueLocalQueue)
	}
	_, err = ParseFerryConfig("config.yaml", []byte("kubernetes:\n  contexts:\n    - {name: a, queued_provisioning: {klass: x}}\n"))
	if got := Errors(err); len(got) != 1 || got[0].Line != 3 || got[0].Field != "kubernetes.contexts[0].queued_provisioning.klass" {
		t.Fatalf("errors %v, want the unknown key at line 3", got)
	}
}

func TestServiceCapacity(t *testing.T) {
	const head = "run: serve\nservice: {readiness_probe: /, replicas: 1, ports: 8080}\nresources:\n  infra: aws\n  accelerators: H100:8\n"
	task, err := Parse("svc.yaml", []byte(head+"  capacity: {reservation: cr-0abc12345def67890}\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if cp := task.Resources.Capacity; cp == nil || cp.Mode != CapacityReserved {
		t.Fatalf("a service in a reservation: %+v", cp)
	}
	task, err = Parse("svc.yaml", []byte(head+"  capacity: {mode: queued}\n"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if cp := task.Resources.Capacity; cp == nil || cp.Mode != CapacityQueued || !cp.NoQueue {
		t.Fatalf("a queued service: %+v, want it kept out of the cloud's queue", cp)
	}
	job, err := Parse("job.yaml", []byte("run: x\nresources:\n  capacity: {mode: queued}\n"), Overrides{})
	if err != nil || job.Resources.Capacity.NoQueue {
		t.Fatalf("a queued job: %+v, %v; want it free to queue", job.Resources.Capacity, err)
	}
	want := wantErr{7, 5, "resources.capacity.max_run_duration", "a job's run limit"}
	_, err = Parse("svc.yaml", []byte(head+"  capacity:\n    max_run_duration: 4h\n"), Overrides{})
	if diff := cmp.Diff([]wantErr{want}, project(Errors(err), []wantErr{want})); diff != "" {
		t.Errorf("errors mismatch (-want +got):\n%s\nfull error:\n%v", diff, err)
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/ferryserve/ferry/bench/sim"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
)

// syncBuffer is a bytes.Buffer safe for the replay goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReplaySpotTraces: a zone whose trace drops to zero preempts the spot VMs there and
// refuses launches until its capacity returns.
func TestReplaySpotTraces(t *testing.T) {
	ec2, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ec2.Close()
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx := context.Background()
	prov, err := aws.New(ctx, aws.Options{Endpoint: ec2.URL(), AMIs: map[string]string{"us-east-1": "ami-0fa4ec10ad"},
		Credentials: awssdk.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""))})
	if err != nil {
		t.Fatal(err)
	}
	spec := launcher.Spec{Name: "svc-1", Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc"}, Run: "exec sleep 60", Port: 8080,
		Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "g5.xlarge", Spot: true}}
	inst, err := prov.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}

	// us-east-1a: up for one tick, down for two, then up; another zone always up.
	// (Long enough that the replay does not wrap around during the test.)
	updown := append([]float64{1, 0, 0}, slices.Repeat([]float64{1}, 1000)...)
	traces := []*sim.SpotTrace{{Zone: "us-east-1a", Gap: 60, Data: updown}, {Zone: "us-east-1b", Gap: 60, Data: []float64{1}}}
	rctx, cancel := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- replaySpotTraces(rctx, &out, ec2, traces, 600) }() // a tick every 100 ms
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "preempted") {
		if time.Now().After(deadline) {
			t.Fatalf("no preemption; replay said:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	got, err := prov.List(ctx, map[string]string{launcher.LabelService: "svc"})
	if err != nil || len(got) != 1 || got[0].ID != inst.ID || got[0].State != launcher.StatePreempted {
		t.Fatalf("after the zone went down: %+v, %v; want the instance preempted", got, err)
	}
	spec.Name = "svc-2"
	if _, err := prov.Launch(ctx, spec); !errors.Is(err, launcher.ErrNoCapacity) && strings.Count(out.String(), "us-east-1a has spot capacity") < 2 {
		t.Fatalf("launch into the downed zone: %v, want ErrNoCapacity", err)
	}
	for !strings.Contains(out.String(), "us-east-1a has spot capacity\n") || strings.Count(out.String(), "us-east-1a has spot capacity") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("capacity never came back; replay said:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	spec.Name = "svc-3"
	if _, err := prov.Launch(ctx, spec); err != nil {
		t.Fatalf("launch after capacity returned: %v", err)
	}
}

// TestFakeCloudPreemptCommand runs `ferry fakecloud` and preempts one of its spot VMs with
// `ferry fakecloud preempt`.
func TestFakeCloudPreemptCommand(t *testing.T) {
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runFakeCloud(ctx, &out, fakeCloudFlags{gcpListen: "127.0.0.1:0", project: "ferry-fake", dir: t.TempDir(), speedup: 60})
	}()
	defer func() { cancel(); <-done }()
	re := regexp.MustCompile(`Fake EC2 on (\S+) and Compute Engine on (\S+);`)
	var m []string
	deadline := time.Now().Add(10 * time.Second)
	for m = re.FindStringSubmatch(out.String()); m == nil; m = re.FindStringSubmatch(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("fakecloud did not start:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	prov, err := aws.New(ctx, aws.Options{Endpoint: m[1], AMIs: map[string]string{"us-east-1": "ami-0fa4ec10ad"},
		Credentials: awssdk.NewCredentialsCache(credentials.NewStaticCredentialsProvider("AKIATEST", "secret", ""))})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := prov.Launch(ctx, launcher.Spec{Name: "svc-1", Labels: map[string]string{launcher.LabelOwner: "true", launcher.LabelService: "svc"},
		Run: "exec sleep 60", Port: 8080, Placement: launcher.Placement{Infra: "aws", Region: "us-east-1", Zone: "use1-az1", InstanceType: "g5.xlarge", Spot: true}})
	if err != nil {
		t.Fatal(err)
	}
	cmd := newRootCmd()
	var stdout bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetArgs([]string{"fakecloud", "preempt", inst.ID, "--control", m[2]})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := prov.List(ctx, map[string]string{launcher.LabelService: "svc"})
	if err != nil || len(got) != 1 || got[0].State != launcher.StatePreempted {
		t.Fatalf("after fakecloud preempt: %+v, %v; want the VM preempted", got, err)
	}
	cmd = newRootCmd()
	cmd.SetArgs([]string{"fakecloud", "preempt", "azure/x/y", "--control", m[2]})
	cmd.SetErr(&bytes.Buffer{})
	if err := cmd.ExecuteContext(ctx); err == nil || !strings.Contains(err.Error(), "not on a fake cloud") {
		t.Fatalf("preempting a foreign id: %v", err)
	}
}

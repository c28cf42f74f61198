package jobs_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
	"github.com/ferryserve/ferry/launcher/fakefault"
	"github.com/ferryserve/ferry/launcher/provision"
)

// A cancel on EC2 while EC2 throttles, with what the controller runs: the real provisioner
// (breakers, janitor) over the real AWS provider, whose SDK clients talk to fakeec2 with its
// fault switch set per operation.

const (
	ec2Region = "us-east-1"
	ec2Zone   = "use1-az4"
	ec2Job    = "name: train\nresources:\n  infra: aws\nrun: exec sleep 3600\n"
)

// onEC2 is the manager's provider in these tests: the provisioner, with a hook that runs
// once after the first Terminate that succeeded (the moment a fault begins in one test).
type onEC2 struct {
	*provision.Provisioner
	afterStop func()
	once      sync.Once
}

func (p *onEC2) Terminate(ctx context.Context, id string) error {
	err := p.Provisioner.Terminate(ctx, id)
	if err == nil && p.afterStop != nil {
		p.once.Do(p.afterStop)
	}
	return err
}

// withEC2 restarts the env's manager over the provisioner on a fresh fakeec2, with its janitor
// running, and returns the fake and the provider. The stop's bound is a minute, as a real
// cloud's Terminate can take: a cancel must not need it.
func withEC2(e *env) (*fakeec2.Server, *onEC2) {
	t := e.t
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(e.home, "no-aws-config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(e.home, "no-aws-credentials"))
	fake, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir(), KillGrace: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	ec2, err := aws.New(context.Background(), aws.Options{
		Regions: []string{ec2Region}, Endpoint: fake.URL(),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDFERRYTEST", "secret", ""),
		AMIs:         map[string]string{ec2Region: "ami-0123456789abcdef0"},
		PollInterval: 10 * time.Millisecond, LogInterval: 100 * time.Millisecond, RequestTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	planner := provision.PlannerFunc(func(context.Context, configs.Resources) ([]launcher.Placement, error) {
		return []launcher.Placement{{Infra: aws.InfraName, Region: ec2Region, Zone: ec2Zone, InstanceType: "c6i.large", PricePerHour: 0.085}}, nil
	})
	prov, err := provision.New(provision.Options{Infras: []provision.Infra{{Name: aws.InfraName, Provider: ec2}}, Planner: planner,
		JanitorInterval: 100 * time.Millisecond, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	janitor := make(chan struct{})
	go func() { defer close(janitor); _ = prov.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-janitor })
	p := &onEC2{Provisioner: prov}
	e.stop()
	e.provider = p
	e.tune = func(cfg *jobs.Config) { cfg.StopTimeout = time.Minute }
	e.start()
	return fake, p
}

// liveOnEC2 are the fake's instances of job id that are not terminated.
func liveOnEC2(fake *fakeec2.Server, id int64) []string {
	var out []string
	for _, in := range fake.Instances() {
		if in.Tags[launcher.LabelJob] == strconv.FormatInt(id, 10) && in.State != "terminated" && in.State != "shutting-down" {
			out = append(out, in.ID+" "+in.State)
		}
	}
	return out
}

// TestCancelWhileEC2Throttles: a cancel under throttling ends the job within seconds — the
// stop waits on neither a node whose Terminate EC2 throttled (the janitor has it) nor a
// console EC2 throttles (the output read so far is kept) — and nothing is left running once
// EC2 answers again.
func TestCancelWhileEC2Throttles(t *testing.T) {
	// promptly covers the SDK's three throttled attempts with its back-off (a few seconds)
	// and a listing: far below the stop's minute.
	const promptly = 15 * time.Second
	throttle := func(ops ...string) fakefault.Fault { return fakefault.Fault{Throttle: true, Ops: ops} }
	tests := []struct {
		name string
		// before is set before the cancel, after once the node's Terminate succeeded.
		before, after *fakefault.Fault
		wantLeft      bool
	}{
		{name: "terminate throttled", before: new(throttle("TerminateInstances")), wantLeft: true},
		{name: "console throttled once stopped", after: new(throttle("DescribeInstances", "GetConsoleOutput"))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			fake, p := withEC2(e)
			j := e.submit(ec2Job)
			e.waitFor(j.ID, 2*time.Minute, "RUNNING on EC2", func(j jobs.Job) bool { return j.State == jobs.Running })
			if tc.before != nil {
				fake.Outages().Set(*tc.before)
			}
			if tc.after != nil {
				p.afterStop = func() { fake.Outages().Set(*tc.after) }
			}
			asked := time.Now()
			if _, err := e.m.Cancel(j.ID); err != nil {
				t.Fatal(err)
			}
			done := e.waitFor(j.ID, promptly, "CANCELLED promptly", func(j jobs.Job) bool {
				return j.State == jobs.Cancelled && len(j.Nodes) == 0
			})
			t.Logf("CANCELLED %v after the cancel: %s", time.Since(asked).Round(time.Millisecond), done.Reason)
			if left := len(done.LeftBehind) > 0; left != tc.wantLeft {
				t.Errorf("left behind %+v, want some: %v", done.LeftBehind, tc.wantLeft)
			}
			if tc.wantLeft && !strings.Contains(done.Reason, "left on aws") {
				t.Errorf("reason %q does not say what was left on aws", done.Reason)
			}
			fake.Outages().Clear()
			deadline := time.Now().Add(time.Minute)
			for live := liveOnEC2(fake, j.ID); len(live) > 0; live = liveOnEC2(fake, j.ID) {
				if time.Now().After(deadline) {
					t.Fatalf("still on EC2 a minute after it answers again: %v (leftovers %+v)", live, p.Leftovers())
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

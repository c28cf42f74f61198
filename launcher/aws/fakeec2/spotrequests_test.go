package fakeec2

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/google/go-cmp/cmp"
)

// testClock is wall-clock time plus an offset the test moves, so VMs boot in real time while
// a notice of minutes passes at once.
type testClock struct{ offset atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *testClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// trapScript is user-data that says when it is asked to stop, so a test sees the VM killed.
const trapScript = "trap 'echo stopped; exit 0' TERM\necho up\nwhile :; do sleep 0.05; done\n"

// runOne launches one instance with the real SDK client and returns its id.
func runOne(t *testing.T, c *ec2.Client, spot bool, userData string) string {
	t.Helper()
	in := &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), InstanceType: "g5.xlarge", MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		UserData: awssdk.String(base64.StdEncoding.EncodeToString([]byte(userData))),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance,
			Tags: []types.Tag{{Key: awssdk.String("ferry.service"), Value: awssdk.String("chat")}}}},
	}
	if spot {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{SpotInstanceType: types.SpotInstanceTypeOneTime, InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate}}
		in.TagSpecifications = append(in.TagSpecifications, types.TagSpecification{ResourceType: types.ResourceTypeSpotInstancesRequest,
			Tags: []types.Tag{{Key: awssdk.String("ferry.service"), Value: awssdk.String("chat")}}})
	}
	out, err := c.RunInstances(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return awssdk.ToString(out.Instances[0].InstanceId)
}

func describeOne(t *testing.T, c *ec2.Client, id string) types.Instance {
	t.Helper()
	out, err := c.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	return out.Reservations[0].Instances[0]
}

func requests(t *testing.T, c *ec2.Client, in *ec2.DescribeSpotInstanceRequestsInput) []types.SpotInstanceRequest {
	t.Helper()
	out, err := c.DescribeSpotInstanceRequests(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return out.SpotInstanceRequests
}

func filter(name string, values ...string) []types.Filter {
	return []types.Filter{{Name: awssdk.String(name), Values: values}}
}

// waitLog polls a VM's log until it contains want.
func waitLog(t *testing.T, s *Server, id, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := readFile(s.logPath(id))
		if strings.Contains(data, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log of %s is %q, want %q in it", id, data, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPreemptWithNotice: during the notice the instance runs and serves while its request
// shows the warning; after it the instance is reclaimed and its VM stopped.
func TestPreemptWithNotice(t *testing.T) {
	for name, tc := range map[string]struct {
		status            string
		wantStateInNotice types.SpotInstanceState
	}{
		"no capacity (default)":  {wantStateInNotice: types.SpotInstanceStateClosed},
		"marked for termination": {status: StatusMarkedForTermination, wantStateInNotice: types.SpotInstanceStateActive},
	} {
		t.Run(name, func(t *testing.T) {
			clock := &testClock{}
			s := newServer(t, Options{Now: clock.now, InterruptionStatus: tc.status})
			c := client(s, "GOOD")
			id := runOne(t, c, true, trapScript)
			waitLog(t, s, id, "up\n")
			in := describeOne(t, c, id)
			sir := awssdk.ToString(in.SpotInstanceRequestId)
			if !strings.HasPrefix(sir, "sir-") {
				t.Fatalf("spot instance has request id %q", sir)
			}
			got := requests(t, c, &ec2.DescribeSpotInstanceRequestsInput{SpotInstanceRequestIds: []string{sir}})
			if len(got) != 1 || got[0].State != types.SpotInstanceStateActive || awssdk.ToString(got[0].Status.Code) != "fulfilled" {
				t.Fatalf("request before the warning: %+v", got)
			}

			markedAt := clock.now()
			if err := s.PreemptWithNotice(id, InterruptionNotice); err != nil {
				t.Fatal(err)
			}
			wantStatus := tc.status
			if wantStatus == "" {
				wantStatus = StatusNoCapacity
			}
			clock.advance(InterruptionNotice - time.Second)
			if st := describeOne(t, c, id).State.Name; st != types.InstanceStateNameRunning {
				t.Fatalf("instance is %s during the notice, want running", st)
			}
			got = requests(t, c, &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("status-code", wantStatus)})
			if len(got) != 1 || awssdk.ToString(got[0].InstanceId) != id || got[0].State != tc.wantStateInNotice {
				t.Fatalf("requests with status %s during the notice: %+v", wantStatus, got)
			}
			if d := got[0].Status.UpdateTime.Sub(markedAt); d < -time.Millisecond || d > time.Second {
				t.Fatalf("status updated at %v, want the warning's time %v", got[0].Status.UpdateTime, markedAt)
			}
			if data, _ := readFile(s.logPath(id)); strings.Contains(data, "stopped") {
				t.Fatalf("VM stopped during the notice: %q", data)
			}

			clock.advance(time.Second)
			in = describeOne(t, c, id)
			if in.State.Name != types.InstanceStateNameShuttingDown || awssdk.ToString(in.StateReason.Code) != ReasonSpotTermination {
				t.Fatalf("after the notice: %s %+v, want shutting-down for %s", in.State.Name, in.StateReason, ReasonSpotTermination)
			}
			waitLog(t, s, id, "stopped\n")
			clock.advance(time.Second)
			if st := describeOne(t, c, id).State.Name; st != types.InstanceStateNameTerminated {
				t.Fatalf("instance is %s after the shutdown, want terminated", st)
			}
			got = requests(t, c, &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("instance-id", id)})
			if len(got) != 1 || got[0].State != types.SpotInstanceStateClosed || awssdk.ToString(got[0].Status.Code) != StatusNoCapacity {
				t.Fatalf("request after the reclaim: %+v", got)
			}
			if err := s.PreemptWithNotice(id, 0); err == nil {
				t.Fatal("preempting a terminated instance succeeded")
			}
		})
	}
}

// TestPreemptWithNoticeEndsOnTime: with the real clock the reclaim happens when the notice
// ends even if no call comes (the VM is stopped without anyone asking EC2).
func TestPreemptWithNoticeEndsOnTime(t *testing.T) {
	s := newServer(t, Options{})
	c := client(s, "GOOD")
	id := runOne(t, c, true, trapScript)
	waitLog(t, s, id, "up\n")
	if err := s.PreemptWithNotice(id, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitLog(t, s, id, "stopped\n")
	// A warning pending at Close does not hold Close up.
	other := runOne(t, c, true, "")
	if err := s.PreemptWithNotice(other, time.Hour); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a reclaim pending")
	}
	if err := s.PreemptWithNotice(other, 0); !errors.Is(err, errClosed) {
		t.Fatalf("preempt after Close: %v, want %v", err, errClosed)
	}
}

// TestDescribeSpotInstanceRequests: the SDK reads every field Ferry uses, filters and ids
// select, on-demand instances have no request, and pages follow NextToken.
func TestDescribeSpotInstanceRequests(t *testing.T) {
	clock := &testClock{}
	s := newServer(t, Options{Now: clock.now})
	c := client(s, "GOOD")
	spot, spot2 := runOne(t, c, true, ""), runOne(t, c, true, "")
	onDemand := runOne(t, c, false, "")
	if in := describeOne(t, c, onDemand); in.SpotInstanceRequestId != nil || in.InstanceLifecycle != "" {
		t.Fatalf("on-demand instance shows spot request %q, lifecycle %q", awssdk.ToString(in.SpotInstanceRequestId), in.InstanceLifecycle)
	}
	sir := awssdk.ToString(describeOne(t, c, spot).SpotInstanceRequestId)
	if err := s.PreemptWithNotice(spot, InterruptionNotice); err != nil {
		t.Fatal(err)
	}

	all := requests(t, c, &ec2.DescribeSpotInstanceRequestsInput{})
	if len(all) != 2 {
		t.Fatalf("%d requests, want 2 (one per spot instance)", len(all))
	}
	r := all[0]
	zones := s.ZoneNames("us-east-1")
	if awssdk.ToString(r.SpotInstanceRequestId) != sir || awssdk.ToString(r.InstanceId) != spot || r.Type != types.SpotInstanceTypeOneTime ||
		r.ProductDescription != types.RIProductDescriptionLinuxUnix || r.InstanceInterruptionBehavior != types.InstanceInterruptionBehaviorTerminate ||
		zones[awssdk.ToString(r.LaunchedAvailabilityZoneId)] != awssdk.ToString(r.LaunchedAvailabilityZone) || r.CreateTime == nil ||
		r.LaunchSpecification == nil || r.LaunchSpecification.InstanceType != "g5.xlarge" || awssdk.ToString(r.LaunchSpecification.ImageId) != "ami-1" ||
		len(r.Tags) != 1 || awssdk.ToString(r.Tags[0].Value) != "chat" || r.Status == nil || awssdk.ToString(r.Status.Message) == "" {
		t.Fatalf("request parsed as %+v (status %+v)", r, r.Status)
	}

	ids := func(rs []types.SpotInstanceRequest) []string {
		var out []string
		for _, r := range rs {
			out = append(out, awssdk.ToString(r.InstanceId))
		}
		return out
	}
	for name, tc := range map[string]struct {
		in   *ec2.DescribeSpotInstanceRequestsInput
		want []string
	}{
		"status-code warned":    {in: &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("status-code", StatusNoCapacity, StatusMarkedForTermination)}, want: []string{spot}},
		"status-code fulfilled": {in: &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("status-code", "fulfilled")}, want: []string{spot2}},
		"state":                 {in: &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("state", "closed")}, want: []string{spot}},
		"instance-id":           {in: &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("instance-id", spot2, onDemand)}, want: []string{spot2}},
		"tag":                   {in: &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("tag:ferry.service", "chat")}, want: []string{spot, spot2}},
		"tag other value":       {in: &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("tag:ferry.service", "other")}},
		"request id":            {in: &ec2.DescribeSpotInstanceRequestsInput{SpotInstanceRequestIds: []string{sir}}, want: []string{spot}},
		"request id and filter": {in: &ec2.DescribeSpotInstanceRequestsInput{SpotInstanceRequestIds: []string{sir}, Filters: filter("state", "active")}},
	} {
		t.Run(name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, ids(requests(t, c, tc.in))); d != "" {
				t.Fatalf("instances (-want +got):\n%s", d)
			}
		})
	}

	for name, tc := range map[string]struct {
		in       *ec2.DescribeSpotInstanceRequestsInput
		wantCode string
	}{
		"unknown request":   {in: &ec2.DescribeSpotInstanceRequestsInput{SpotInstanceRequestIds: []string{"sir-00000000"}}, wantCode: "InvalidSpotInstanceRequestID.NotFound"},
		"malformed request": {in: &ec2.DescribeSpotInstanceRequestsInput{SpotInstanceRequestIds: []string{"i-1"}}, wantCode: "InvalidSpotInstanceRequestID.Malformed"},
		"unknown filter":    {in: &ec2.DescribeSpotInstanceRequestsInput{Filters: filter("nope", "x")}, wantCode: "InvalidParameterValue"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.DescribeSpotInstanceRequests(context.Background(), tc.in)
			var ae smithy.APIError
			if !errors.As(err, &ae) || ae.ErrorCode() != tc.wantCode {
				t.Fatalf("error %v, want %s", err, tc.wantCode)
			}
		})
	}

	// Seven requests in all, five a page.
	for range 5 {
		runOne(t, c, true, "")
	}
	pages := ec2.NewDescribeSpotInstanceRequestsPaginator(c, &ec2.DescribeSpotInstanceRequestsInput{MaxResults: awssdk.Int32(5)})
	var n, calls int
	for pages.HasMorePages() {
		page, err := pages.NextPage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		n, calls = n+len(page.SpotInstanceRequests), calls+1
	}
	if n != 7 || calls != 2 {
		t.Fatalf("%d requests in %d pages, want 7 in 2", n, calls)
	}
}

// TestSpotCapacity: a zone's spot capacity refuses the spot instance beyond it with
// InsufficientInstanceCapacity, not an on-demand one, and an instance warned of its
// interruption no longer holds a place.
func TestSpotCapacity(t *testing.T) {
	clock := &testClock{}
	s := newServer(t, Options{Now: clock.now})
	c := client(s, "GOOD")
	first := runOne(t, c, true, "")
	zone := s.Instances()[0].ZoneName
	s.SetSpotCapacity(zone, 1)
	_, err := c.RunInstances(context.Background(), &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), InstanceType: "g5.xlarge",
		MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		InstanceMarketOptions: &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot}})
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode() != "InsufficientInstanceCapacity" {
		t.Fatalf("a second spot instance in a zone of spot capacity 1: %v, want InsufficientInstanceCapacity", err)
	}
	runOne(t, c, false, "")
	if err := s.PreemptWithNotice(first, time.Hour); err != nil {
		t.Fatal(err)
	}
	runOne(t, c, true, "")
	s.SetSpotCapacity(zone, -1)
	runOne(t, c, true, "")
	if n := len(s.Instances()); n != 4 {
		t.Errorf("%d instances, want 4", n)
	}
}

package fakeec2

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/ferryserve/ferry/launcher/fakefault"
)

// faultTimeout bounds every wait in these tests: generous, for a loaded machine.
const faultTimeout = 20 * time.Second

// regionClient is the real SDK client aimed at s in region, with no retries so that each
// answer shows.
func regionClient(s *Server, region string) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:           region,
		BaseEndpoint:     awssdk.String(s.URL()),
		Credentials:      credentials.NewStaticCredentialsProvider("AKID", "secret", ""),
		RetryMaxAttempts: 1,
	})
}

// apiError is the EC2 code and HTTP status of err; fails the test when err is not an answer.
func apiError(t *testing.T, err error) (string, int) {
	t.Helper()
	var ae smithy.APIError
	var re *awshttp.ResponseError
	if !errors.As(err, &ae) || !errors.As(err, &re) {
		t.Fatalf("error %v is not an EC2 error answer", err)
	}
	return ae.ErrorCode(), re.HTTPStatusCode()
}

func describeZones(ctx context.Context, c *ec2.Client) error {
	_, err := c.DescribeAvailabilityZones(ctx, &ec2.DescribeAvailabilityZonesInput{})
	return err
}

func runIn(ctx context.Context, c *ec2.Client, placement *types.Placement) error {
	_, err := c.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		InstanceType: types.InstanceTypeT3Micro, Placement: placement})
	return err
}

// TestFaultAnswers: each kind of error fault is answered in EC2's error envelope with the code
// and status EC2 uses, which the SDK reads as an API error.
func TestFaultAnswers(t *testing.T) {
	for name, tc := range map[string]struct {
		fault      fakefault.Fault
		wantCode   string
		wantStatus int
	}{
		"throttle":             {fault: fakefault.Fault{Throttle: true}, wantCode: "RequestLimitExceeded", wantStatus: 503},
		"503":                  {fault: fakefault.Fault{Status: 503}, wantCode: "Unavailable", wantStatus: 503},
		"500":                  {fault: fakefault.Fault{Status: 500}, wantCode: "InternalError", wantStatus: 500},
		"404":                  {fault: fakefault.Fault{Status: 404}, wantCode: "NotFound", wantStatus: 404},
		"403":                  {fault: fakefault.Fault{Status: 403}, wantCode: "UnauthorizedOperation", wantStatus: 403},
		"status with its code": {fault: fakefault.Fault{Status: 503, Code: "ServiceUnavailable", Message: "down for maintenance"}, wantCode: "ServiceUnavailable", wantStatus: 503},
		"throttle wins":        {fault: fakefault.Fault{Throttle: true, Status: 500}, wantCode: "RequestLimitExceeded", wantStatus: 503},
	} {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, Options{})
			s.Outages().Set(tc.fault)
			err := describeZones(context.Background(), regionClient(s, "us-east-1"))
			code, status := apiError(t, err)
			if code != tc.wantCode || status != tc.wantStatus {
				t.Fatalf("answer %s (%d), want %s (%d): %v", code, status, tc.wantCode, tc.wantStatus, err)
			}
			var ae smithy.APIError
			errors.As(err, &ae)
			if ae.ErrorMessage() == "" || (tc.fault.Message != "" && ae.ErrorMessage() != tc.fault.Message) {
				t.Fatalf("message %q, want EC2's or the fault's", ae.ErrorMessage())
			}
			s.Outages().Clear()
			if err := describeZones(context.Background(), regionClient(s, "us-east-1")); err != nil {
				t.Fatalf("after Clear: %v", err)
			}
		})
	}
}

// TestFaultScope: a fault takes only the requests its region, zone (by name or ID) and
// operations name, and none of the action's work is done for a request it takes.
func TestFaultScope(t *testing.T) {
	s := newServer(t, Options{})
	ctx := context.Background()
	east, west := regionClient(s, "us-east-1"), regionClient(s, "us-west-2")
	names := s.ZoneNames("us-east-1")
	failing, other := "use1-az4", "use1-az6"

	s.Outages().Set(fakefault.Fault{Region: "us-west-2", Status: 503})
	if err := describeZones(ctx, east); err != nil {
		t.Fatalf("us-east-1 under a us-west-2 fault: %v", err)
	}
	if code, _ := apiError(t, describeZones(ctx, west)); code != "Unavailable" {
		t.Fatalf("us-west-2: %s, want Unavailable", code)
	}

	s.Outages().Set(fakefault.Fault{Ops: []string{"DescribeInstances"}, Status: 500})
	if err := describeZones(ctx, east); err != nil {
		t.Fatalf("another action under a DescribeInstances fault: %v", err)
	}
	if _, err := east.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err == nil {
		t.Fatal("DescribeInstances under its fault succeeded")
	}

	for _, spelling := range []string{failing, names[failing]} {
		s.Outages().Set(fakefault.Fault{Zone: spelling, Status: 503})
		before := len(s.Instances())
		for _, pl := range []*types.Placement{{AvailabilityZone: awssdk.String(names[failing])}, {AvailabilityZoneId: awssdk.String(failing)}} {
			if code, _ := apiError(t, runIn(ctx, east, pl)); code != "Unavailable" {
				t.Fatalf("fault on zone %s: RunInstances in it answered %s, want Unavailable", spelling, code)
			}
		}
		if n := len(s.Instances()); n != before {
			t.Fatalf("fault on zone %s: the refused RunInstances launched %d instance(s)", spelling, n-before)
		}
		if err := runIn(ctx, east, &types.Placement{AvailabilityZone: awssdk.String(names[other])}); err != nil {
			t.Fatalf("fault on zone %s: RunInstances in %s: %v", spelling, other, err)
		}
		if _, err := east.DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); err != nil {
			t.Fatalf("fault on zone %s: a request about no zone: %v", spelling, err)
		}
	}
}

// TestFaultRate: a fault with a rate takes some of the matching requests, not all.
func TestFaultRate(t *testing.T) {
	s := newServer(t, Options{})
	s.Outages().Set(fakefault.Fault{Throttle: true, Rate: 0.5})
	c := regionClient(s, "us-east-1")
	var failed, passed int
	for range 100 {
		if err := describeZones(context.Background(), c); err != nil {
			if code, _ := apiError(t, err); code != "RequestLimitExceeded" {
				t.Fatalf("answer %s, want RequestLimitExceeded", code)
			}
			failed++
		} else {
			passed++
		}
	}
	if failed == 0 || passed == 0 {
		t.Fatalf("%d throttled, %d answered: want some of each at rate 0.5", failed, passed)
	}
	if n := s.Calls("DescribeAvailabilityZones", "us-east-1"); n != 100 {
		t.Fatalf("Calls counted %d requests, want 100, faulted ones included", n)
	}
	if n := s.Calls("DescribeAvailabilityZones", "us-west-2"); n != 0 {
		t.Fatalf("Calls counted %d requests in a region asked nothing", n)
	}
}

// TestFaultFor: a fault with For ends by itself: the endpoint recovers.
func TestFaultFor(t *testing.T) {
	s := newServer(t, Options{})
	s.Outages().Set(fakefault.Fault{Status: 503, For: time.Second})
	c := regionClient(s, "us-east-1")
	if code, _ := apiError(t, describeZones(context.Background(), c)); code != "Unavailable" {
		t.Fatalf("answer %s, want Unavailable", code)
	}
	deadline := time.Now().Add(faultTimeout)
	for describeZones(context.Background(), c) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("still failing %v after a 1s fault was set", faultTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitHeld waits until the server holds n requests.
func waitHeld(t *testing.T, s *Server, n int) {
	t.Helper()
	deadline := time.Now().Add(faultTimeout)
	for s.Held() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d request(s) held after %v, want %d", s.Held(), faultTimeout, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFaultHang: a hung request is never answered: the client's deadline cuts it, and the
// action does not run. Cleared, the fault lets a held request go on and be answered.
func TestFaultHang(t *testing.T) {
	s := newServer(t, Options{})
	c := regionClient(s, "us-east-1")
	s.Outages().Set(fakefault.Fault{Hang: true, Ops: []string{"RunInstances"}})

	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	start := time.Now()
	err := runIn(ctx, c, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung RunInstances: %v, want the client's deadline", err)
	}
	if d := time.Since(start); d > faultTimeout {
		t.Fatalf("hung call returned after %v", d)
	}
	waitHeld(t, s, 0) // the client gave up: the server lets go too
	if n := len(s.Instances()); n != 0 {
		t.Fatalf("a hung RunInstances launched %d instance(s)", n)
	}
	if err := describeZones(context.Background(), c); err != nil {
		t.Fatalf("an action the hang does not take: %v", err)
	}

	done := make(chan error, 1)
	go func() { done <- runIn(context.Background(), c, nil) }()
	waitHeld(t, s, 1)
	select {
	case err := <-done:
		t.Fatalf("a hung request was answered: %v", err)
	default:
	}
	s.Outages().Clear()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("released by Clear: %v, want the action's answer", err)
		}
	case <-time.After(faultTimeout):
		t.Fatal("Clear did not release the hung request")
	}
	if n := len(s.Instances()); n != 1 {
		t.Fatalf("%d instance(s) after the released RunInstances, want 1", n)
	}
}

// TestFaultHangReleasedByClose: closing the server drops the connections of hung requests at
// once, rather than waiting for their clients to give up.
func TestFaultHangReleasedByClose(t *testing.T) {
	s, err := New(Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	s.Outages().Set(fakefault.Fault{Hang: true})
	done := make(chan error, 1)
	go func() { done <- describeZones(context.Background(), regionClient(s, "us-east-1")) }()
	waitHeld(t, s, 1)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a hung request was answered at Close")
		}
	case <-time.After(faultTimeout):
		t.Fatal("Close did not release the hung request")
	}
	select {
	case <-closed:
	case <-time.After(faultTimeout):
		t.Fatal("Close did not return")
	}
	waitHeld(t, s, 0)
}

// TestFaultDelay: a slow endpoint answers, late; a delay with a status answers the error late.
func TestFaultDelay(t *testing.T) {
	s := newServer(t, Options{})
	c := regionClient(s, "us-east-1")
	const delay = 300 * time.Millisecond
	s.Outages().Set(fakefault.Fault{Delay: delay})
	start := time.Now()
	if err := describeZones(context.Background(), c); err != nil {
		t.Fatalf("slow endpoint: %v", err)
	}
	if d := time.Since(start); d < delay {
		t.Fatalf("answered after %v, want at least %v", d, delay)
	}
	s.Outages().Set(fakefault.Fault{Delay: delay, Status: http.StatusServiceUnavailable})
	start = time.Now()
	if code, _ := apiError(t, describeZones(context.Background(), c)); code != "Unavailable" {
		t.Fatalf("answer %s, want Unavailable", code)
	}
	if d := time.Since(start); d < delay {
		t.Fatalf("error answered after %v, want at least %v", d, delay)
	}
}

// TestFaultSparesMetadataService: an API outage is the API's; a VM's metadata service goes on
// answering (it is the instance's, not the endpoint's).
func TestFaultSparesMetadataService(t *testing.T) {
	s := newServer(t, Options{})
	out, err := client(s, "AKID").RunInstances(context.Background(), &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	s.Outages().Set(fakefault.Fault{Status: 503})
	if code, _ := imdsCall(t, s, awssdk.ToString(out.Instances[0].InstanceId), "PUT", "latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"}); code != http.StatusOK {
		t.Fatalf("metadata token under an API outage: %d, want 200", code)
	}
}

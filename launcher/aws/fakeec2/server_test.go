package fakeec2

import (
	"context"
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	"github.com/google/go-cmp/cmp"
)

func newServer(t *testing.T, opts Options) *Server {
	t.Helper()
	opts.LogDir = t.TempDir()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// client is the real SDK client aimed at s, with no retries so that status codes show.
func client(s *Server, key string) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:           "us-east-1",
		BaseEndpoint:     awssdk.String(s.URL()),
		Credentials:      credentials.NewStaticCredentialsProvider(key, "secret", ""),
		RetryMaxAttempts: 1,
	})
}

func TestErrorEnvelope(t *testing.T) {
	s := newServer(t, Options{})
	for name, tc := range map[string]struct {
		auth       string
		form       url.Values
		wantStatus int
		wantCode   string
	}{
		"no authorization": {form: url.Values{"Action": {"DescribeInstances"}}, wantStatus: 401, wantCode: "MissingAuthenticationToken"},
		"unknown action": {
			auth: "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00",
			form: url.Values{"Action": {"Frobnicate"}}, wantStatus: 400, wantCode: "InvalidAction",
		},
	} {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, s.URL(), strings.NewReader(tc.form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var env struct {
				XMLName xml.Name `xml:"Response"`
				Errors  []struct {
					Code, Message string
				} `xml:"Errors>Error"`
				RequestID string `xml:"RequestID"`
			}
			if err := xml.Unmarshal(body, &env); err != nil {
				t.Fatalf("%v in %s", err, body)
			}
			if resp.StatusCode != tc.wantStatus || len(env.Errors) != 1 || env.Errors[0].Code != tc.wantCode || env.Errors[0].Message == "" || env.RequestID == "" {
				t.Fatalf("status %d, body %s; want %d %s", resp.StatusCode, body, tc.wantStatus, tc.wantCode)
			}
		})
	}
}

func TestSDKParsesErrors(t *testing.T) {
	s := newServer(t, Options{BadAccessKeys: []string{"BAD"}, DeniedAccessKeys: []string{"DENIED"}})
	s.FailZone("use1-az1", "InsufficientInstanceCapacity")
	zoneAZ1 := s.ZoneNames("us-east-1")["use1-az1"]
	run := func(c *ec2.Client) error {
		_, err := c.RunInstances(context.Background(), &ec2.RunInstancesInput{
			ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
			Placement: &types.Placement{AvailabilityZone: awssdk.String(zoneAZ1)},
		})
		return err
	}
	for name, tc := range map[string]struct {
		call       func() error
		wantCode   string
		wantStatus int
	}{
		"auth failure":          {call: func() error { return run(client(s, "BAD")) }, wantCode: "AuthFailure", wantStatus: 401},
		"unauthorized":          {call: func() error { return run(client(s, "DENIED")) }, wantCode: "UnauthorizedOperation", wantStatus: 403},
		"insufficient capacity": {call: func() error { return run(client(s, "GOOD")) }, wantCode: "InsufficientInstanceCapacity", wantStatus: 500},
		"instance not found": {call: func() error {
			_, err := client(s, "GOOD").DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{InstanceIds: []string{"i-0123456789abcdef0"}})
			return err
		}, wantCode: "InvalidInstanceID.NotFound", wantStatus: 400},
		"bad filter": {call: func() error {
			_, err := client(s, "GOOD").DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{Filters: []types.Filter{{Name: awssdk.String("nope"), Values: []string{"x"}}}})
			return err
		}, wantCode: "InvalidParameterValue", wantStatus: 400},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			var ae smithy.APIError
			var re *awshttp.ResponseError
			if !errors.As(err, &ae) || !errors.As(err, &re) {
				t.Fatalf("error %v is not an API error with a response", err)
			}
			if ae.ErrorCode() != tc.wantCode || re.HTTPStatusCode() != tc.wantStatus || ae.ErrorMessage() == "" {
				t.Fatalf("code %s status %d message %q; want %s %d", ae.ErrorCode(), re.HTTPStatusCode(), ae.ErrorMessage(), tc.wantCode, tc.wantStatus)
			}
		})
	}
}

func TestSDKParsesInstances(t *testing.T) {
	s := newServer(t, Options{})
	c := client(s, "GOOD")
	ctx := context.Background()
	zones, err := c.DescribeAvailabilityZones(ctx, &ec2.DescribeAvailabilityZonesInput{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, z := range zones.AvailabilityZones {
		got[awssdk.ToString(z.ZoneId)] = awssdk.ToString(z.ZoneName)
	}
	if d := cmp.Diff(s.ZoneNames("us-east-1"), got); d != "" || len(got) == 0 {
		t.Fatalf("zones (-want +got):\n%s", d)
	}
	zone := got["use1-az4"]
	out, err := c.RunInstances(ctx, &ec2.RunInstancesInput{
		ImageId: awssdk.String("ami-1"), InstanceType: "g5.xlarge", MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		UserData:              awssdk.String(base64.StdEncoding.EncodeToString([]byte("echo booted on $FERRY_HOST\n"))),
		Placement:             &types.Placement{AvailabilityZone: awssdk.String(zone)},
		InstanceMarketOptions: &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot},
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance,
			Tags: []types.Tag{{Key: awssdk.String("ferry.service"), Value: awssdk.String("chat")}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Instances) != 1 {
		t.Fatalf("%d instances", len(out.Instances))
	}
	in := out.Instances[0]
	if in.State.Name != types.InstanceStateNamePending || in.InstanceLifecycle != types.InstanceLifecycleTypeSpot ||
		awssdk.ToString(in.Placement.AvailabilityZone) != zone || awssdk.ToString(in.Placement.AvailabilityZoneId) != "use1-az4" ||
		!strings.HasPrefix(awssdk.ToString(in.PrivateIpAddress), "127.") || in.LaunchTime == nil || time.Since(*in.LaunchTime) > time.Minute ||
		len(in.Tags) != 1 || awssdk.ToString(in.Tags[0].Value) != "chat" || in.InstanceType != "g5.xlarge" {
		t.Fatalf("instance parsed as %+v", in)
	}
	// Six more reservations, then page through them five at a time with a tag filter.
	for range 6 {
		if _, err := c.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance,
				Tags: []types.Tag{{Key: awssdk.String("ferry.service"), Value: awssdk.String("chat")}}}}}); err != nil {
			t.Fatal(err)
		}
	}
	pages := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{MaxResults: awssdk.Int32(5),
		Filters: []types.Filter{{Name: awssdk.String("tag:ferry.service"), Values: []string{"chat"}}}})
	var n, calls int
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		calls++
		for _, r := range page.Reservations {
			n += len(r.Instances)
		}
	}
	if n != 7 || calls != 2 {
		t.Fatalf("%d instances in %d pages, want 7 in 2", n, calls)
	}
	// Terminate and see the state change and reason.
	id := awssdk.ToString(in.InstanceId)
	term, err := c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if term.TerminatingInstances[0].CurrentState.Name != types.InstanceStateNameShuttingDown {
		t.Fatalf("terminate: %+v", term.TerminatingInstances[0].CurrentState)
	}
	desc, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if r := desc.Reservations[0].Instances[0].StateReason; r == nil || awssdk.ToString(r.Code) != ReasonUserShutdown {
		t.Fatalf("state reason %+v", r)
	}
}

func TestVMRunsUserDataOnItsAddress(t *testing.T) {
	s := newServer(t, Options{})
	c := client(s, "GOOD")
	ctx := context.Background()
	out, err := c.RunInstances(ctx, &ec2.RunInstancesInput{
		ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		UserData: awssdk.String(base64.StdEncoding.EncodeToString([]byte("echo host=$FERRY_HOST; exec sleep 300\n"))),
	})
	if err != nil {
		t.Fatal(err)
	}
	in := out.Instances[0]
	want := "host=" + awssdk.ToString(in.PrivateIpAddress) + "\n"
	var snap Instance
	for _, i := range s.Instances() {
		snap = i
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := readFile(snap.LogPath)
		if data == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("log %q, want %q", data, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Preempt(snap.ID); err == nil {
		t.Fatal("preempting an on-demand instance succeeded")
	}
}

func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	return string(b), err
}

// TestRunInstancesMetadataOptions: the SDK's MetadataOptions reach the fake, are validated as
// EC2 validates them, and come back in DescribeInstances.
func TestRunInstancesMetadataOptions(t *testing.T) {
	s := newServer(t, Options{MetadataDefaults: MetadataOptions{HopLimit: 2}})
	c := client(s, "GOOD")
	ctx := context.Background()
	run := func(m *types.InstanceMetadataOptionsRequest) (*ec2.RunInstancesOutput, error) {
		return c.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1), MetadataOptions: m})
	}
	out, err := run(&types.InstanceMetadataOptionsRequest{
		HttpTokens: types.HttpTokensStateRequired, HttpPutResponseHopLimit: awssdk.Int32(1), HttpEndpoint: types.InstanceMetadataEndpointStateEnabled,
	})
	if err != nil {
		t.Fatal(err)
	}
	id := awssdk.ToString(out.Instances[0].InstanceId)
	desc, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	mo := desc.Reservations[0].Instances[0].MetadataOptions
	if mo == nil || mo.HttpTokens != types.HttpTokensStateRequired || awssdk.ToInt32(mo.HttpPutResponseHopLimit) != 1 || mo.HttpEndpoint != types.InstanceMetadataEndpointStateEnabled {
		t.Fatalf("DescribeInstances metadata options %+v, want required tokens, hop limit 1, endpoint enabled", mo)
	}
	if _, err := run(nil); err != nil {
		t.Fatal(err)
	}
	var got []MetadataOptions
	for _, in := range s.Instances() {
		got = append(got, in.Metadata)
	}
	want := []MetadataOptions{
		{HTTPTokens: "required", HopLimit: 1, HTTPEndpoint: "enabled", InstanceMetadataTags: "disabled"},
		{HTTPTokens: "optional", HopLimit: 2, HTTPEndpoint: "enabled", InstanceMetadataTags: "disabled"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("recorded metadata options (-want +got):\n%s", d)
	}
	for name, m := range map[string]*types.InstanceMetadataOptionsRequest{
		"hop limit 0":  {HttpPutResponseHopLimit: awssdk.Int32(0)},
		"hop limit 65": {HttpPutResponseHopLimit: awssdk.Int32(65)},
		"tokens":       {HttpTokens: "sometimes"},
	} {
		var ae smithy.APIError
		if _, err := run(m); !errors.As(err, &ae) || ae.ErrorCode() != "InvalidParameterValue" {
			t.Errorf("%s: %v, want InvalidParameterValue", name, err)
		}
	}
}

// TestSecurityGroupIngress: rules per source (CIDR block or security group) with descriptions,
// authorized and revoked through the SDK as EC2 does: a duplicate or a missing rule fails the
// whole call and changes nothing.
func TestSecurityGroupIngress(t *testing.T) {
	s := newServer(t, Options{})
	c := client(s, "GOOD")
	ctx := context.Background()
	group := func(name string) string {
		out, err := c.CreateSecurityGroup(ctx, &ec2.CreateSecurityGroupInput{GroupName: awssdk.String(name), Description: awssdk.String(name)})
		if err != nil {
			t.Fatal(err)
		}
		return awssdk.ToString(out.GroupId)
	}
	replicas, proxies := group("replicas"), group("proxies")
	perm := func(cidr, sg string) types.IpPermission {
		p := types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(8080), ToPort: awssdk.Int32(8080)}
		if cidr != "" {
			p.IpRanges = []types.IpRange{{CidrIp: awssdk.String(cidr), Description: awssdk.String("from " + cidr)}}
		}
		if sg != "" {
			p.UserIdGroupPairs = []types.UserIdGroupPair{{GroupId: awssdk.String(sg), Description: awssdk.String("from the proxies")}}
		}
		return p
	}
	authorize := func(p types.IpPermission) error {
		_, err := c.AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: awssdk.String(replicas), IpPermissions: []types.IpPermission{p}})
		return err
	}
	revoke := func(p types.IpPermission) error {
		_, err := c.RevokeSecurityGroupIngress(ctx, &ec2.RevokeSecurityGroupIngressInput{GroupId: awssdk.String(replicas), IpPermissions: []types.IpPermission{p}})
		return err
	}
	code := func(err error) string {
		var ae smithy.APIError
		if errors.As(err, &ae) {
			return ae.ErrorCode()
		}
		return fmt.Sprint(err)
	}
	if err := authorize(perm("10.0.3.17/32", proxies)); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"duplicate source with a new one": {authorize(perm("10.9.9.9/32", proxies)), "InvalidPermission.Duplicate"},
		"unknown source group":            {authorize(perm("", "sg-0000000000000000f")), "InvalidGroup.NotFound"},
		"malformed CIDR":                  {authorize(perm("10.0.0.300/32", "")), "InvalidParameterValue"},
		"revoke a rule that is not there": {revoke(perm("10.9.9.9/32", proxies)), "InvalidPermission.NotFound"},
	} {
		if got := code(tc.err); got != tc.want {
			t.Errorf("%s: %s, want %s", name, got, tc.want)
		}
	}
	out, err := c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: []string{replicas}})
	if err != nil {
		t.Fatal(err)
	}
	perms := out.SecurityGroups[0].IpPermissions
	if len(perms) != 1 || len(perms[0].IpRanges) != 1 || len(perms[0].UserIdGroupPairs) != 1 ||
		awssdk.ToString(perms[0].IpRanges[0].CidrIp) != "10.0.3.17/32" || awssdk.ToString(perms[0].IpRanges[0].Description) != "from 10.0.3.17/32" ||
		awssdk.ToString(perms[0].UserIdGroupPairs[0].GroupId) != proxies || awssdk.ToString(perms[0].UserIdGroupPairs[0].Description) != "from the proxies" {
		t.Fatalf("described permissions %+v, want one for 8080 from the CIDR and the group, with descriptions", perms)
	}
	if err := revoke(types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(8080), ToPort: awssdk.Int32(8080),
		IpRanges: []types.IpRange{{CidrIp: awssdk.String("10.0.3.17/32")}}}); err != nil {
		t.Fatalf("revoke without the description: %v", err)
	}
	want := []IngressRule{{Protocol: "tcp", FromPort: 8080, ToPort: 8080, GroupID: proxies, Description: "from the proxies"}}
	if d := cmp.Diff(want, s.IngressRules("us-east-1", "replicas")); d != "" {
		t.Fatalf("rules after revoke (-want +got):\n%s", d)
	}
}

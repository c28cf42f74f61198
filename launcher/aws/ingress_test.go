package aws

import (
	"context"
	"encoding/base64"
	"errors"
	"net/netip"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws/fakeec2"
)

// sdk is a plain EC2 client on the fake, to set up what an earlier controller or an operator
// left in the account.
func sdk(fake *fakeec2.Server) *ec2.Client {
	return ec2.New(ec2.Options{Region: testRegion, BaseEndpoint: awssdk.String(fake.URL()),
		Credentials: credentials.NewStaticCredentialsProvider(goodKey, "secret", "")})
}

func createGroup(t *testing.T, c *ec2.Client, name string) string {
	t.Helper()
	out, err := c.CreateSecurityGroup(context.Background(), &ec2.CreateSecurityGroupInput{GroupName: awssdk.String(name), Description: awssdk.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	return awssdk.ToString(out.GroupId)
}

func authorizeCIDRs(t *testing.T, c *ec2.Client, group string, port int32, desc string, cidrs ...string) {
	t.Helper()
	perm := types.IpPermission{IpProtocol: awssdk.String("tcp"), FromPort: awssdk.Int32(port), ToPort: awssdk.Int32(port)}
	for _, cidr := range cidrs {
		perm.IpRanges = append(perm.IpRanges, types.IpRange{CidrIp: awssdk.String(cidr), Description: awssdk.String(desc)})
	}
	if _, err := c.AuthorizeSecurityGroupIngress(context.Background(), &ec2.AuthorizeSecurityGroupIngressInput{
		GroupId: awssdk.String(group), IpPermissions: []types.IpPermission{perm}}); err != nil {
		t.Fatal(err)
	}
}

// controllerRule is the rule admitting this host's route source to ip on port.
func controllerRule(t *testing.T, ip string, port int) fakeec2.IngressRule {
	t.Helper()
	src, err := launcher.RouteSource(ip)
	if err != nil {
		t.Fatal(err)
	}
	return fakeec2.IngressRule{Protocol: "tcp", FromPort: port, ToPort: port, CIDR: src.String(), Description: descController}
}

// TestIngressAdmitsOnlyTheController: with no proxy source configured, the service port admits
// the controller's own address (the one its host routes from to the replica), not the private
// ranges, and a second replica adds nothing.
func TestIngressAdmitsOnlyTheController(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	inst, err := e.p.Launch(ctx, spec("in-1", "exec sleep 300", false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Launch(ctx, spec("in-2", "exec sleep 300", true)); err != nil {
		t.Fatal(err)
	}
	want := []fakeec2.IngressRule{controllerRule(t, fakeInstance(t, e.fake, inst.ID).PrivateIP, 8081)}
	if d := cmp.Diff(want, e.fake.IngressRules(testRegion, DefaultSecurityGroup)); d != "" {
		t.Fatalf("ingress rules (-want +got):\n%s", d)
	}
}

// TestIngressFromConfiguredSources: configured CIDRs and security groups are exactly what the
// port admits; the controller address a controller without them had added is revoked.
func TestIngressFromConfiguredSources(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	ctx := context.Background()
	first, err := e.p.Launch(ctx, spec("cfg-1", "exec sleep 300", false))
	if err != nil {
		t.Fatal(err)
	}
	proxies := createGroup(t, sdk(e.fake), "proxies")
	p, err := New(ctx, Options{
		Regions: []string{testRegion}, Endpoint: e.fake.URL(), Credentials: credentials.NewStaticCredentialsProvider(goodKey, "secret", ""),
		AMIs: map[string]string{testRegion: "ami-0123456789abcdef0"}, LaunchTimeout: testTimeout, PollInterval: 10 * time.Millisecond,
		IngressCIDRs: []string{"10.20.0.7/24"}, IngressSecurityGroups: []string{proxies},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The restarted controller adopts the first instance and launches a second.
	if got, err := p.List(ctx, map[string]string{launcher.LabelReplicaID: "cfg-1"}); err != nil || len(got) != 1 || got[0].ID != first.ID {
		t.Fatalf("List = %v, %v; want the first instance adopted", got, err)
	}
	if _, err := p.Launch(ctx, spec("cfg-2", "exec sleep 300", false)); err != nil {
		t.Fatal(err)
	}
	want := []fakeec2.IngressRule{
		{Protocol: "tcp", FromPort: 8081, ToPort: 8081, CIDR: "10.20.0.0/24", Description: descConfigured},
		{Protocol: "tcp", FromPort: 8081, ToPort: 8081, GroupID: proxies, Description: descConfigured},
	}
	if d := cmp.Diff(want, e.fake.IngressRules(testRegion, DefaultSecurityGroup)); d != "" {
		t.Fatalf("ingress rules (-want +got):\n%s", d)
	}
	for name, opts := range map[string]Options{"cidr": {IngressCIDRs: []string{"10.0.0.0/33"}}, "group": {IngressSecurityGroups: []string{"proxies"}}} {
		if _, err := New(ctx, opts); !errors.Is(err, launcher.ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", name, err)
		}
	}
}

// TestIngressNarrowsTheOldRule: a controller upgraded from one that opened the service port to
// every private range revokes that rule when it adopts the old instances (no launch needed)
// and on the first launch on another port, admits itself first, and leaves alone a rule an
// operator added.
func TestIngressNarrowsTheOldRule(t *testing.T) {
	fake, err := fakeec2.New(fakeec2.Options{LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Close() })
	ctx := context.Background()
	c := sdk(fake)
	group := createGroup(t, c, DefaultSecurityGroup)
	private := []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}
	authorizeCIDRs(t, c, group, 8081, descLegacy, private...)
	authorizeCIDRs(t, c, group, 9090, descLegacy, private...)
	authorizeCIDRs(t, c, group, 8081, "ops vpn", "198.51.100.0/24")
	// An instance the old controller launched, serving on 8081.
	old := spec("old-1", "exec sleep 300", false)
	out, err := c.RunInstances(ctx, &ec2.RunInstancesInput{
		ImageId: awssdk.String("ami-0123456789abcdef0"), InstanceType: testType, MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		SecurityGroupIds: []string{group}, UserData: awssdk.String(base64.StdEncoding.EncodeToString([]byte("exec sleep 300\n"))),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: tags(old, 8081, "")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ip := awssdk.ToString(out.Instances[0].PrivateIpAddress)
	p := newProvider(t, fake, goodKey)
	waitFor(t, testTimeout, "the old instance is adopted running", func() (bool, string) {
		got, err := p.List(ctx, map[string]string{launcher.LabelReplicaID: "old-1"})
		return err == nil && len(got) == 1 && got[0].State == launcher.StateRunning, ""
	})
	want := []fakeec2.IngressRule{
		{Protocol: "tcp", FromPort: 8081, ToPort: 8081, CIDR: "198.51.100.0/24", Description: "ops vpn"},
		controllerRule(t, ip, 8081),
	}
	var on9090 []fakeec2.IngressRule
	for _, cidr := range private {
		on9090 = append(on9090, fakeec2.IngressRule{Protocol: "tcp", FromPort: 9090, ToPort: 9090, CIDR: cidr, Description: descLegacy})
	}
	if d := cmp.Diff(append(on9090, want...), sgRules(fake)); d != "" {
		t.Fatalf("after adoption (-want +got):\n%s", d)
	}
	s := spec("new-1", "exec sleep 300", false)
	s.Port = 9090
	if _, err := p.Launch(ctx, s); err != nil {
		t.Fatal(err)
	}
	want = append(want, controllerRule(t, ip, 9090))
	if d := cmp.Diff(want, sgRules(fake)); d != "" {
		t.Fatalf("after a launch on 9090 (-want +got):\n%s", d)
	}
}

func sgRules(fake *fakeec2.Server) []fakeec2.IngressRule {
	return fake.IngressRules(testRegion, DefaultSecurityGroup)
}

// TestIngressFailsSafe: when the controller's address cannot be told, nothing is admitted
// (not a private range) and the log says what to configure.
func TestIngressFailsSafe(t *testing.T) {
	e := newEnv(t, fakeec2.Options{}, goodKey)
	core, logs := observer.New(zap.InfoLevel)
	e.p.log = zap.New(core)
	e.p.routeSource = func(string) (netip.Prefix, error) { return netip.Prefix{}, errors.New("no route") }
	if _, err := e.p.Launch(context.Background(), spec("fs-1", "exec sleep 300", false)); err != nil {
		t.Fatal(err)
	}
	if rules := e.fake.IngressRules(testRegion, DefaultSecurityGroup); len(rules) != 0 {
		t.Fatalf("ingress rules %+v, want none", rules)
	}
	if got := logs.FilterLevelExact(zap.ErrorLevel).FilterMessageSnippet("aws.proxy_cidrs").Len(); got != 1 {
		t.Fatalf("%d error logs naming aws.proxy_cidrs, want 1: %v", got, logs.All())
	}
}

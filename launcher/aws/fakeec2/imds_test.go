package fakeec2

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// imdsCall is one request to an instance's metadata service as a VM makes it.
func imdsCall(t *testing.T, s *Server, id, method, path string, header map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL()+imdsPrefix+id+"/"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestInstanceMetadataService: IMDSv2 tokens are required when the instance says so, tags are
// served only when enabled in its metadata options (and follow CreateTags), and a spot
// instance's instance-action appears with its interruption warning.
func TestInstanceMetadataService(t *testing.T) {
	s := newServer(t, Options{})
	c := client(s, "AKID")
	ctx := context.Background()
	run := func(tags types.InstanceMetadataTagsState, spot bool) string {
		in := &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeInstance, Tags: []types.Tag{{Key: awssdk.String("team"), Value: awssdk.String("ml")}}}},
			MetadataOptions:   &types.InstanceMetadataOptionsRequest{HttpTokens: types.HttpTokensStateRequired, InstanceMetadataTags: tags}}
		if spot {
			in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot}
		}
		out, err := c.RunInstances(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		return awssdk.ToString(out.Instances[0].InstanceId)
	}
	tagged, untagged := run(types.InstanceMetadataTagsStateEnabled, true), run("", false)

	if code, _ := imdsCall(t, s, tagged, "GET", "latest/meta-data/instance-id", nil); code != http.StatusUnauthorized {
		t.Fatalf("GET without a token: %d, want 401 (IMDSv2 required)", code)
	}
	if code, _ := imdsCall(t, s, tagged, "PUT", "latest/api/token", nil); code != http.StatusBadRequest {
		t.Fatalf("token PUT without a TTL: %d, want 400", code)
	}
	token := func(id string) map[string]string {
		code, tok := imdsCall(t, s, id, "PUT", "latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60"})
		if code != http.StatusOK || tok == "" {
			t.Fatalf("token PUT: %d %q", code, tok)
		}
		return map[string]string{"X-aws-ec2-metadata-token": tok}
	}
	tok := token(tagged)
	if code, _ := imdsCall(t, s, untagged, "GET", "latest/meta-data/instance-id", tok); code != http.StatusUnauthorized {
		t.Fatalf("another instance's token: %d, want 401", code)
	}
	for path, want := range map[string]string{
		"latest/meta-data/instance-id":        tagged,
		"latest/meta-data/tags/instance":      "team",
		"latest/meta-data/tags/instance/team": "ml",
	} {
		if code, body := imdsCall(t, s, tagged, "GET", path, tok); code != http.StatusOK || body != want {
			t.Errorf("GET %s: %d %q, want %q", path, code, body, want)
		}
	}
	if code, _ := imdsCall(t, s, untagged, "GET", "latest/meta-data/tags/instance/team", token(untagged)); code != http.StatusNotFound {
		t.Fatalf("tags of an instance without them in metadata: %d, want 404", code)
	}
	if _, err := c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{tagged}, Tags: []types.Tag{{Key: awssdk.String("ferry-node-ips"), Value: awssdk.String("127.0.0.1 127.0.0.2")}}}); err != nil {
		t.Fatal(err)
	}
	if code, body := imdsCall(t, s, tagged, "GET", "latest/meta-data/tags/instance/ferry-node-ips", tok); code != http.StatusOK || body != "127.0.0.1 127.0.0.2" {
		t.Fatalf("tag added after launch: %d %q", code, body)
	}
	if code, _ := imdsCall(t, s, tagged, "GET", "latest/meta-data/spot/instance-action", tok); code != http.StatusNotFound {
		t.Fatalf("instance-action before a warning: %d, want 404", code)
	}
	if err := s.PreemptWithNotice(tagged, InterruptionNotice); err != nil {
		t.Fatal(err)
	}
	code, body := imdsCall(t, s, tagged, "GET", "latest/meta-data/spot/instance-action", tok)
	if code != http.StatusOK || !strings.Contains(body, `"action":"terminate"`) || !strings.Contains(body, time.Now().Add(InterruptionNotice).UTC().Format("2006-01-02T15:04")) {
		t.Fatalf("instance-action after a warning: %d %s", code, body)
	}
}

// TestGuestPowerOff: a VM whose user-data powers off shuts down as EC2 does with the terminate
// shutdown behaviour, and its console output stays readable.
func TestGuestPowerOff(t *testing.T) {
	s := newServer(t, Options{})
	c := client(s, "AKID")
	ctx := context.Background()
	script := base64.StdEncoding.EncodeToString([]byte("#!/bin/bash\necho bye\npoweroff\n"))
	out, err := c.RunInstances(ctx, &ec2.RunInstancesInput{ImageId: awssdk.String("ami-1"), MinCount: awssdk.Int32(1), MaxCount: awssdk.Int32(1),
		UserData: awssdk.String(script), InstanceInitiatedShutdownBehavior: types.ShutdownBehaviorTerminate})
	if err != nil {
		t.Fatal(err)
	}
	id := awssdk.ToString(out.Instances[0].InstanceId)
	deadline := time.Now().Add(30 * time.Second)
	for {
		in := s.Instances()[0]
		if in.State == "terminated" && in.StateReason == ReasonInstanceInitiatedShutdown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance is %s (%s), want terminated by its guest", in.State, in.StateReason)
		}
		time.Sleep(10 * time.Millisecond)
	}
	co, err := c.GetConsoleOutput(ctx, &ec2.GetConsoleOutputInput{InstanceId: awssdk.String(id)})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := base64.StdEncoding.DecodeString(awssdk.ToString(co.Output)); string(b) != "bye\n" {
		t.Fatalf("console output after the end: %q, want \"bye\\n\"", b)
	}
}

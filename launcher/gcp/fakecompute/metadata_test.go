package fakecompute

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"
	"google.golang.org/protobuf/proto"
)

// TestMetadataServerAndSerialPort: a VM reads its attributes from its metadata server (with
// Metadata-Flavor: Google only), setMetadata changes them against the current fingerprint, the
// serial port serves the VM's output by offset, and a guest that powers off stops the VM.
func TestMetadataServerAndSerialPort(t *testing.T) {
	fake, ic, _ := newClients(t, Options{Project: "p"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	vm := vmResource("vm-1")
	script := `curl -sf -H 'Metadata-Flavor: Google' "$FERRY_GCE_METADATA_URL/computeMetadata/v1/instance/attributes/greeting"; echo
until v=$(curl -sf -H 'Metadata-Flavor: Google' "$FERRY_GCE_METADATA_URL/computeMetadata/v1/instance/attributes/later"); do sleep 0.05; done
echo "later: $v"
curl -s -o /dev/null -w '%{http_code}\n' "$FERRY_GCE_METADATA_URL/computeMetadata/v1/instance/attributes/greeting"
poweroff`
	vm.Metadata = &computepb.Metadata{Items: []*computepb.Items{
		{Key: proto.String("startup-script"), Value: proto.String(script)},
		{Key: proto.String("greeting"), Value: proto.String("hello")},
	}}
	op, err := ic.Insert(ctx, &computepb.InsertInstanceRequest{Project: "p", Zone: "us-central1-a", InstanceResource: vm})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := ic.Get(ctx, &computepb.GetInstanceRequest{Project: "p", Zone: "us-central1-a", Instance: "vm-1"})
	if err != nil {
		t.Fatal(err)
	}
	items := append(got.GetMetadata().GetItems(), &computepb.Items{Key: proto.String("later"), Value: proto.String("127.0.0.1\n127.0.0.2")})
	stale := &computepb.Metadata{Fingerprint: proto.String("stale"), Items: items}
	_, err = ic.SetMetadata(ctx, &computepb.SetMetadataInstanceRequest{Project: "p", Zone: "us-central1-a", Instance: "vm-1", MetadataResource: stale})
	var gerr *googleapi.Error
	if !errors.As(err, &gerr) || gerr.Code != http.StatusPreconditionFailed {
		t.Fatalf("setMetadata with a stale fingerprint: %v, want 412", err)
	}
	op, err = ic.SetMetadata(ctx, &computepb.SetMetadataInstanceRequest{Project: "p", Zone: "us-central1-a", Instance: "vm-1",
		MetadataResource: &computepb.Metadata{Fingerprint: got.GetMetadata().Fingerprint, Items: items}})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		vm, _, _ := fake.Instance("vm-1")
		if vm.GetStatus() == "TERMINATED" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("VM is %s, want TERMINATED after its guest powered off", vm.GetStatus())
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := "hello\nlater: 127.0.0.1\n127.0.0.2\n403\n"
	out, err := ic.GetSerialPortOutput(ctx, &computepb.GetSerialPortOutputInstanceRequest{Project: "p", Zone: "us-central1-a", Instance: "vm-1", Port: proto.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	if out.GetContents() != want || out.GetNext() != int64(len(want)) {
		t.Fatalf("serial output %q next %d, want %q next %d", out.GetContents(), out.GetNext(), want, len(want))
	}
	out, err = ic.GetSerialPortOutput(ctx, &computepb.GetSerialPortOutputInstanceRequest{Project: "p", Zone: "us-central1-a", Instance: "vm-1", Port: proto.Int32(1), Start: proto.Int64(6)})
	if err != nil || out.GetContents() != want[6:] || out.GetStart() != 6 {
		t.Fatalf("serial output from 6: %q start %d (%v), want %q", out.GetContents(), out.GetStart(), err, want[6:])
	}
}

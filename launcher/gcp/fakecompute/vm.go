package fakecompute

import (
	"os"
	"path/filepath"
	"strconv"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"github.com/ferryserve/ferry/launcher/internal/fakevm"
)

// Environment a VM's startup script gets from the fake besides Options.Env and fakevm's,
// standing in for what a real machine has.
const (
	// EnvMetadataURL is the base URL of the VM's metadata server; unset on GCE, where it is
	// http://metadata.google.internal. The fake serves each VM under a path of its own,
	// because every fake VM shares the host's loopback and the fake cannot tell them apart by
	// address as GCE does.
	EnvMetadataURL = "FERRY_GCE_METADATA_URL"
	// EnvPreemptionNotice is Options.PreemptionNotice in seconds, what a VM's watcher takes
	// for GCE's 30 s between a preemption notice and the stop (GCE does not say it).
	EnvPreemptionNotice = "FERRY_GCE_PREEMPTION_NOTICE_SECONDS"
)

// startupScript returns the instance's startup-script metadata value.
func startupScript(pb *computepb.Instance) string {
	for _, it := range pb.GetMetadata().GetItems() {
		if it.GetKey() == "startup-script" {
			return it.GetValue()
		}
	}
	return ""
}

// boot runs the startup script (fakevm.Start) in the VM's own directory, with FERRY_HOST set
// to the VM's address. A VM without a script, or a server without a Dir, runs nothing (and is
// still RUNNING, as a real VM would be). A script that powers the guest off stops the VM
// (TERMINATED) when it ends. A closed server boots nothing. Called with s.mu held.
func (s *Server) boot(zone string, in *instance) *fakevm.VM {
	pb := in.pb
	script := startupScript(pb)
	if script == "" || s.opts.Dir == "" || s.closed {
		return nil
	}
	dir := s.vmDir(zone, pb.GetName())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil
	}
	path := filepath.Join(dir, "startup-script")
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		return nil
	}
	v, err := fakevm.Start(fakevm.Boot{
		Script: path, Dir: dir,
		Env: append(append([]string(nil), s.opts.Env...),
			"FERRY_HOST="+pb.GetNetworkInterfaces()[0].GetNetworkIP(), "HOME="+dir,
			EnvMetadataURL+"=http://"+s.metadataHost+metadataPrefix+zone+"/"+pb.GetName(),
			EnvPreemptionNotice+"="+strconv.Itoa(int(s.opts.PreemptionNotice/time.Second))),
		StateDir: filepath.Join(dir, "state"), Disk: filepath.Join(dir, "disk"),
		// One region's VMs share one network filesystem, as they would one Filestore share.
		NFSRoot:      filepath.Join(s.opts.Dir, "nfs", regionOf(zone)),
		PowerOffFile: filepath.Join(dir, "poweroff"),
		GuestBin:     filepath.Join(s.opts.Dir, "guest-bin"),
		Log:          s.LogPath(zone, pb.GetName()),
	})
	if err != nil {
		return nil // said in its log
	}
	s.vms.Add(1) // Close waits for the script's end
	go func() {
		defer s.vms.Done()
		<-v.Done()
		if v.PoweredOff() {
			s.powerOff(in, v)
		}
	}()
	return v
}

// powerOff stops a VM whose guest powered off, as GCE does: STOPPING, then TERMINATED (the
// VM stays, stopped, until deleted).
func (s *Server) powerOff(in *instance, v *fakevm.VM) {
	s.mu.Lock()
	if s.closed || in.vm != v || in.pb.GetStatus() != "RUNNING" {
		s.mu.Unlock()
		return
	}
	in.pb.Status = proto.String("STOPPING")
	in.vm = nil
	s.mu.Unlock()
	v.Kill(killWait)
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.pb.GetStatus() == "STOPPING" {
		in.pb.Status = proto.String("TERMINATED")
		in.pb.LastStopTimestamp = proto.String(time.Now().Format(timeLayout))
	}
}

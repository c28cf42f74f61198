package fakeec2

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/ferryserve/ferry/launcher/internal/fakevm"
)

// vm is a booted instance: its user-data's process session (fakevm), and the killer that ends
// it when the instance terminates.
type vm struct {
	*fakevm.VM
	killOnce sync.Once
	// wg is the server's: Close waits for the VM's watcher and its killer.
	wg *sync.WaitGroup
}

// EnvIMDSEndpoint, set in a VM's user-data environment besides Options.Env and fakevm's, is
// the base URL of the instance's metadata service; unset on EC2, where it is
// http://169.254.169.254. The fake serves each instance under a path of its own, because every
// fake VM shares the host's loopback and the fake cannot tell them apart by address as EC2
// does by network interface.
const EnvIMDSEndpoint = "FERRY_IMDS_ENDPOINT"

// ReasonInstanceInitiatedShutdown is the state reason of an instance whose guest shut it
// down (with InstanceInitiatedShutdownBehavior terminate, it then terminates).
const ReasonInstanceInitiatedShutdown = "Client.InstanceInitiatedShutdown"

// boot writes the user-data to LogDir and runs it (fakevm.Start) with FERRY_HOST set to the
// instance's private IP; its state directory is LogDir/ID.d. A guest that powers off
// terminates the instance once its user-data ends. Callers hold s.mu.
func (s *Server) boot(in *instance, script []byte) (*vm, error) {
	if len(script) == 0 {
		return nil, nil // an instance without user-data boots to nothing
	}
	path := s.opts.LogDir + "/" + in.id + ".user-data"
	if err := os.WriteFile(path, script, 0o700); err != nil {
		return nil, fmt.Errorf("write user-data: %w", err)
	}
	stateDir := s.opts.LogDir + "/" + in.id + ".d"
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("make state dir: %w", err)
	}
	booted, err := fakevm.Start(fakevm.Boot{
		Script: path, Dir: s.opts.LogDir,
		Env: append(append([]string(nil), s.opts.Env...),
			"FERRY_HOST="+in.privateIP, "FERRY_INSTANCE_ID="+in.id, "FERRY_ZONE="+in.zone.name,
			EnvIMDSEndpoint+"="+s.URL()+imdsPrefix+in.id),
		StateDir: stateDir, Disk: filepath.Join(stateDir, "disk"),
		// One region's VMs share one network filesystem, as they would one EFS.
		NFSRoot:      filepath.Join(s.opts.LogDir, "nfs", in.region),
		PowerOffFile: filepath.Join(stateDir, "poweroff"),
		GuestBin:     filepath.Join(s.opts.LogDir, "guest-bin"),
		Log:          s.logPath(in.id),
	})
	if err != nil {
		return nil, err
	}
	v := &vm{VM: booted, wg: &s.vms}
	s.vms.Add(1)
	go func() {
		defer s.vms.Done()
		<-v.Done()
		if v.PoweredOff() {
			s.powerOff(in)
		}
	}()
	return v, nil
}

// powerOff shuts down an instance whose guest powered off: it terminates, as
// InstanceInitiatedShutdownBehavior terminate (Ferry's) asks. The fake has no stopped
// instances: it terminates whatever the behavior, where EC2's default (stop) would stop it.
func (s *Server) powerOff(in *instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !in.live() {
		return
	}
	s.end(in, s.opts.Now(), ReasonInstanceInitiatedShutdown, "Client.InstanceInitiatedShutdown: Instance initiated shutdown", "Instance initiated shutdown")
}

// kill sends SIGTERM to the VM's session and, after grace or once everything in it is gone,
// SIGKILL to whatever is left. It does not block.
func (v *vm) kill(grace time.Duration) {
	v.killOnce.Do(func() {
		v.Signal(syscall.SIGTERM)
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			v.WaitEmpty(grace)
			v.Kill(0)
		}()
	})
}

package fakevm

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// boot starts script on a VM of its own under t's temporary directory.
func boot(t *testing.T, script string) (*VM, Boot) {
	t.Helper()
	dir := t.TempDir()
	b := Boot{
		Script: filepath.Join(dir, "boot.sh"), Dir: dir,
		StateDir: filepath.Join(dir, "state"), Disk: filepath.Join(dir, "disk"), NFSRoot: filepath.Join(dir, "nfs"),
		PowerOffFile: filepath.Join(dir, "poweroff"), GuestBin: filepath.Join(dir, "guest-bin"), Log: filepath.Join(dir, "console.log"),
	}
	if err := os.WriteFile(b.Script, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	v, err := Start(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Kill(time.Second) })
	return v, b
}

func waitDone(t *testing.T, v *VM) {
	t.Helper()
	select {
	case <-v.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the boot script did not end")
	}
}

// TestPowerOff: the guest's poweroff is the fake's, and the script's environment is the VM's.
func TestPowerOff(t *testing.T) {
	v, b := boot(t, `echo "state $FERRY_STATE_DIR disk $FERRY_VM_ROOT nfs $FERRY_FAKE_NFS_ROOT"; poweroff`)
	waitDone(t, v)
	if !v.PoweredOff() {
		t.Fatal("a guest that ran poweroff is not powered off")
	}
	out, _ := os.ReadFile(b.Log)
	if want := "state " + b.StateDir + " disk " + b.Disk + " nfs " + b.NFSRoot + "\n"; string(out) != want {
		t.Fatalf("console %q, want %q", out, want)
	}
	other, _ := boot(t, "exit 0")
	waitDone(t, other)
	if other.PoweredOff() {
		t.Fatal("a guest that did not power off is powered off")
	}
}

// TestKillEndsTheSession: what the script started in a process group of its own dies with it.
func TestKillEndsTheSession(t *testing.T) {
	v, b := boot(t, "set -m\nsleep 300 &\necho started\nwait")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if out, _ := os.ReadFile(b.Log); strings.Contains(string(out), "started") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the script did not start")
		}
	}
	v.Kill(5 * time.Second)
	waitDone(t, v)
	if v.Signal(syscall.Signal(0)) {
		t.Fatal("a process of the session outlived Kill")
	}
}

package vmnode

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// testWatch is a cloud whose warning is a file in the node's state directory and which leaves
// 7 s.
var testWatch = PreemptionWatch{
	Locals:  "local left=7",
	Warned:  `[ -e "$ferry_state/warned" ]`,
	Poll:    1,
	Warning: "test warning",
	Fate:    "the VM is being taken",
}

// bootVMJob runs JobBoot's script for a node whose run is run, as a VM would (with a
// poweroff that leaves a file, and a `sleep infinity` that returns at once), and returns its
// output and whether it powered off.
func bootVMJob(t *testing.T, run string) (output string, poweredOff bool) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	guest := map[string]string{
		"poweroff": "#!/bin/sh\n: > \"$FERRY_STATE_DIR/poweroff\"\n",
		"sleep":    "#!/bin/sh\n[ \"$1\" = infinity ] && exit 0\nexec /bin/sleep \"$@\"\n",
	}
	for name, script := range guest {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := launcher.Spec{Name: "node", Run: run, Job: &launcher.JobSpec{CheckpointDir: filepath.Join(dir, "ckpt")}}
	boot, err := JobBoot("test", spec, "", testWatch)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	cmd := exec.Command("bash", "-c", boot)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "FERRY_STATE_DIR="+state)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("boot script: %v\n%s", err, out)
	}
	_, err = os.Stat(filepath.Join(state, "poweroff"))
	return string(out), err == nil
}

// TestJobBootExit: a run that ends by itself has its status marked, and the VM powers off.
func TestJobBootExit(t *testing.T) {
	out, off := bootVMJob(t, "echo working; exit 3")
	if got, ok := ParseExitStatus(out); !ok || got != 3 || !off {
		t.Fatalf("exit status %d (marked %v), powered off %v; want 3, marked, off:\n%s", got, ok, off, out)
	}
}

// TestJobBootWarning: at the cloud's warning the run gets SIGTERM with the seconds left in the
// preemption file; the node then marks no status and does not power off.
func TestJobBootWarning(t *testing.T) {
	out, off := bootVMJob(t, `trap 'echo "SIGTERM with $(cat "$`+EnvPreemptionFile+`")"; exit 0' TERM
touch "$FERRY_STATE_DIR/warned"
while :; do sleep 0.1; done`)
	for _, want := range []string{
		"ferry: test warning, 7s left: SIGTERM to the run\n",
		"SIGTERM with " + launcher.EnvPreemptionGrace + "=7\n",
		"ferry: the run ended with status 0 after a test warning; the VM is being taken\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, ok := ParseExitStatus(out); ok || off {
		t.Fatalf("a warned node marked an exit status (%v) or powered off (%v):\n%s", ok, off, out)
	}
}

func TestJobBootRefusesItsDelimiter(t *testing.T) {
	spec := launcher.Spec{Name: "node", Run: "cat <<" + vmJobEOF + "\nhi\n" + vmJobEOF + "\n", Job: &launcher.JobSpec{}}
	if _, err := JobBoot("test", spec, "", testWatch); !errors.Is(err, launcher.ErrInvalid) {
		t.Fatalf("a run with the line %s: %v, want ErrInvalid", vmJobEOF, err)
	}
}

func TestParseExitStatus(t *testing.T) {
	for name, tc := range map[string]struct {
		console string
		want    int
		wantOK  bool
	}{
		"none":            {console: "hello\n"},
		"plain":           {console: "x\n" + ExitMarker + "0\n", want: 0, wantOK: true},
		"console prefix":  {console: "[  12.3] cloud-init[99]: " + ExitMarker + "42\r\n", want: 42, wantOK: true},
		"agent prefix":    {console: "Nov 25 21:00:00 vm google_metadata_script_runner[9]: startup-script: " + ExitMarker + "42\r\n", want: 42, wantOK: true},
		"last one counts": {console: ExitMarker + "1\nmore\n" + ExitMarker + "2\n", want: 2, wantOK: true},
		"mid-line":        {console: "echo " + ExitMarker + "5 and more\n"},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := ParseExitStatus(tc.console)
			if ok != tc.wantOK || got != tc.want {
				t.Fatalf("ParseExitStatus = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// TestExitCodes: a node's console is read again only after the retry interval while it shows
// no status, and never once it has.
func TestExitCodes(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := NewExitCodes(15 * time.Second)
	c.now = func() time.Time { return now }
	reads := 0
	console, readErr := "booting\n", error(nil)
	read := func() (string, error) { reads++; return console, readErr }
	get := func(wantCode int, wantOK bool, wantReads int) {
		t.Helper()
		code, ok := c.Get("vm-1", read)
		if code != wantCode || ok != wantOK || reads != wantReads {
			t.Fatalf("at %s: Get = %d, %v after %d reads; want %d, %v after %d", now.Format(time.TimeOnly), code, ok, reads, wantCode, wantOK, wantReads)
		}
	}
	get(0, false, 1)
	get(0, false, 1) // within the retry interval: not read
	now = now.Add(15 * time.Second)
	console, readErr = ExitMarker+"4\n", errors.New("console unavailable")
	get(0, false, 2) // a failed read counts as nothing there
	now = now.Add(15 * time.Second)
	readErr = nil
	get(4, true, 3)
	now = now.Add(time.Hour)
	get(4, true, 3) // cached
	if code, ok := c.Get("vm-2", func() (string, error) { return "", nil }); ok {
		t.Fatalf("another node has status %d from vm-1's", code)
	}
}

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Replica logs on every infra: `serve logs` reads a pod's log through the API server and a
// VM's console output through its cloud's API, and -f follows them until the replica ends.
// The line written after the follow starts is replica-sim's report that its faults file
// appeared: the test creates the file once the follow shows the replica's start-up.

// logFollower is a running `ferry serve logs ... -f`.
type logFollower struct {
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
}

func (f *logFollower) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out.Write(p)
}

func (f *logFollower) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out.String()
}

func (e *env) followLogs(service string, id int) *logFollower {
	e.t.Helper()
	f := &logFollower{done: make(chan error, 1)}
	cmd := e.cmd("serve", "logs", service, fmt.Sprint(id), "-f")
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, stderr.String())
		}
		f.done <- err
	}()
	e.t.Cleanup(func() { _ = cmd.Process.Kill() })
	return f
}

// checkReplicaLogs runs the checks every infra shares on service's one READY replica: its log,
// a clear error for a replica that does not exist, and a follow that receives a line written
// after it started and ends when the service goes down.
func checkReplicaLogs(t *testing.T, e *env, service, faultsFile string) {
	t.Helper()
	var id int
	eventually(t, 120*time.Second, service+" READY", func() (bool, string) {
		st, err := e.status(service)
		if err != nil {
			return false, err.Error()
		}
		for rid := range st.ready() {
			id = rid
			return true, ""
		}
		return false, fmt.Sprintf("%+v", st.Replicas)
	})
	const startup = "replica-sim: serving model"
	if out := e.mustRun("serve", "logs", service, fmt.Sprint(id), "--tail", "5"); !strings.Contains(out, startup) {
		t.Fatalf("serve logs %s %d lacks %q:\n%s", service, id, startup, out)
	}
	_, errOut, err := e.run("serve", "logs", service, "999")
	if err == nil || !strings.Contains(errOut, "no replica 999") {
		t.Fatalf("logs of replica 999: err %v, stderr %q; want it named as missing", err, errOut)
	}

	f := e.followLogs(service, id)
	eventually(t, 60*time.Second, "the follow shows the start-up", func() (bool, string) {
		return strings.Contains(f.String(), startup), f.String()
	})
	if err := os.WriteFile(faultsFile, []byte("--error-rate 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	applied := "faults file " + faultsFile + " applied"
	eventually(t, 60*time.Second, "the follow receives the line written after it started", func() (bool, string) {
		return strings.Contains(f.String(), applied), f.String()
	})

	e.mustRun("serve", "down", service, "-y")
	select {
	case err := <-f.done:
		if err != nil {
			t.Fatalf("the follow ended with %v", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatalf("serve logs -f still following 90s after its replica went down:\n%s", f.String())
	}
}

const kubeLogsYAML = `name: klogs
resources:
  infra: kubernetes
  accelerators: V100:1
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b --faults-file %s
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT
`

// TestServeLogsKubernetes: a pod's log through the API server (the kubelet stand-in serves
// containerLogs), followed.
func TestServeLogsKubernetes(t *testing.T) {
	k := newKubeEnv(t, "Tesla-V100-SXM2-16GB", 1, 1, 60)
	faults := filepath.Join(t.TempDir(), "faults")
	file := filepath.Join(t.TempDir(), "klogs.yaml")
	writeFile(t, file, fmt.Sprintf(kubeLogsYAML, faults))
	k.mustRun("serve", "up", file, "-y", "--no-wait")
	checkReplicaLogs(t, k.env, "klogs", faults)
}

// logsYAML is a one-replica service on one infra (and accelerator, for the clouds).
const logsYAML = `name: %s
resources:
  infra: %s%s
envs:
  FAULTS: %s
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
run: exec ferry replica-sim --model ferry-sim-1b --faults-file "$FAULTS"
`

// TestServeLogsFakeClouds: a VM's console output (EC2's GetConsoleOutput, GCE's serial port)
// through the real SDKs against the fake clouds, followed.
func TestServeLogsFakeClouds(t *testing.T) {
	clouds := startFakeClouds(t)
	e := newEnv(t)
	e.extraEnv = awsEnv
	writeFile(t, filepath.Join(e.home, "config.yaml"), clouds.config())
	for _, c := range []struct{ name, infra, acc string }{
		{"awslogs", "aws", "\n  accelerators: A10G:1"},
		{"gcplogs", "gcp", "\n  accelerators: L4:1"},
	} {
		t.Logf("a replica on %s", c.infra)
		faults := filepath.Join(t.TempDir(), "faults")
		file := filepath.Join(t.TempDir(), c.name+".yaml")
		writeFile(t, file, fmt.Sprintf(logsYAML, c.name, c.infra, c.acc, faults))
		e.mustRun("serve", "up", file, "-y", "--no-wait")
		checkReplicaLogs(t, e, c.name, faults)
	}
}

// TestServeLogsLocal: a local replica's log file, followed until the replica goes.
func TestServeLogsLocal(t *testing.T) {
	e := newEnv(t)
	faults := filepath.Join(t.TempDir(), "faults")
	file := filepath.Join(t.TempDir(), "locallogs.yaml")
	writeFile(t, file, fmt.Sprintf(logsYAML, "locallogs", "local", "", faults))
	e.mustRun("serve", "up", file, "-y", "--no-wait")
	checkReplicaLogs(t, e, "locallogs", faults)
}

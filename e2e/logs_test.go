package e2e

import (
	"bytes"
	"context"
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

// shows reports whether the follow's output holds want, and what it holds (and how it ended,
// if it did).
func (f *logFollower) shows(want string) (bool, string) {
	out := f.String()
	select {
	case err := <-f.done:
		f.done <- err
		return strings.Contains(out, want), fmt.Sprintf("the follow ended (%v) after:\n%s", err, out)
	default:
	}
	return strings.Contains(out, want), out
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
//
// The follow starts once pick chooses a replica, which may not have started yet (the follow
// then waits for its log); release, if not nil, runs right after the follow started.
func checkReplicaLogs(t *testing.T, e *env, service, faultsFile string, pick func(serviceStatus) (int, bool), release func()) {
	t.Helper()
	var id int
	eventually(t, 60*time.Second, "a replica of "+service+" to follow", func() (bool, string) {
		st, err := e.status(service)
		if err != nil {
			return false, err.Error()
		}
		var ok bool
		id, ok = pick(st)
		return ok, fmt.Sprintf("%+v", st.Replicas)
	})
	f := e.followLogs(service, id)
	if release != nil {
		release()
	}
	eventually(t, 120*time.Second, service+" READY", func() (bool, string) {
		st, err := e.status(service)
		if err != nil {
			return false, err.Error()
		}
		_, ok := st.ready()[id]
		return ok, fmt.Sprintf("%+v", st.Replicas)
	})
	const startup = "replica-sim: serving model"
	if out := e.mustRun("serve", "logs", service, fmt.Sprint(id), "--tail", "5"); !strings.Contains(out, startup) {
		t.Fatalf("serve logs %s %d lacks %q:\n%s", service, id, startup, out)
	}
	_, errOut, err := e.run("serve", "logs", service, "999")
	if err == nil || !strings.Contains(errOut, "no replica 999") {
		t.Fatalf("logs of replica 999: err %v, stderr %q; want it named as missing", err, errOut)
	}

	eventually(t, 60*time.Second, "the follow shows the start-up", func() (bool, string) { return f.shows(startup) })
	if err := os.WriteFile(faultsFile, []byte("--error-rate 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	applied := "faults file " + faultsFile + " applied"
	eventually(t, 60*time.Second, "the follow receives the line written after it started", func() (bool, string) { return f.shows(applied) })

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

// firstReplica picks the first replica listed.
func firstReplica(st serviceStatus) (int, bool) {
	if len(st.Replicas) == 0 {
		return 0, false
	}
	return st.Replicas[0].ID, true
}

const kubeLogsYAML = `name: klogs
resources:
  infra: kubernetes
  accelerators: V100:1
envs:
  REPLICA_SIM_ARGS: --model ferry-sim-1b --faults-file %s
service:
  readiness_probe: /health
  replicas: 2
  ports: 8080
run: ferry replica-sim --port $FERRY_PORT
`

// TestServeLogsKubernetes: a pod's log through the API server (the kubelet stand-in serves
// containerLogs), followed from before the pod is scheduled: one node has room for one of the
// two replicas, and the other's node is added once the follow runs.
func TestServeLogsKubernetes(t *testing.T) {
	k := newKubeEnv(t, "Tesla-V100-SXM2-16GB", 1, 1, 120)
	faults := filepath.Join(t.TempDir(), "faults")
	file := filepath.Join(t.TempDir(), "klogs.yaml")
	writeFile(t, file, fmt.Sprintf(kubeLogsYAML, faults))
	k.mustRun("serve", "up", file, "-y", "--no-wait")
	waiting := func(st serviceStatus) (int, bool) {
		unscheduled := 0
		for _, p := range k.pods("klogs") {
			if p.Spec.NodeName == "" {
				unscheduled++
			}
		}
		ready := st.ready()
		for _, r := range st.Replicas {
			if _, ok := ready[r.ID]; !ok && len(ready) == 1 && unscheduled == 1 {
				t.Logf("following replica %d, %s, its pod unscheduled", r.ID, r.Status)
				return r.ID, true
			}
		}
		return 0, false
	}
	addNode := func() {
		if err := k.cluster.AddGPUNode(context.Background(), "tesla-v100-sxm2-16gb-1", "Tesla-V100-SXM2-16GB", 1); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k.cluster.DeleteNode(context.Background(), "tesla-v100-sxm2-16gb-1") }) // for the next run
	}
	checkReplicaLogs(t, k.env, "klogs", faults, waiting, addNode)
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
	t.Parallel()
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
		checkReplicaLogs(t, e, c.name, faults, firstReplica, nil)
	}
}

// TestServeLogsLocal: a local replica's log file, followed until the replica goes.
func TestServeLogsLocal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	faults := filepath.Join(t.TempDir(), "faults")
	file := filepath.Join(t.TempDir(), "locallogs.yaml")
	writeFile(t, file, fmt.Sprintf(logsYAML, "locallogs", "local", "", faults))
	e.mustRun("serve", "up", file, "-y", "--no-wait")
	checkReplicaLogs(t, e, "locallogs", faults, firstReplica, nil)
}

package replicas

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/testcluster"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/local"
)

// serverEnv makes the test binary a replica: an HTTP server on $FERRY_HOST:$FERRY_PORT that
// answers its pid and process group, so the integration test runs real processes without
// assuming any other program is installed.
const serverEnv = "FERRY_TEST_HTTP_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		os.Exit(serveReplica())
	}
	os.Exit(testcluster.Main(m))
}

type replicaIdentity struct {
	PID       int    `json:"pid"`
	PGID      int    `json:"pgid"`
	ReplicaID string `json:"replica_id"`
}

func serveReplica() int {
	ln, err := net.Listen("tcp", net.JoinHostPort(os.Getenv("FERRY_HOST"), os.Getenv("FERRY_PORT")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	id := replicaIdentity{PID: os.Getpid(), PGID: syscall.Getpgrp(), ReplicaID: os.Getenv(EnvReplicaID)}
	fmt.Printf("replica %s serving on %s\n", id.ReplicaID, ln.Addr())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(id)
	})}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	go func() {
		<-stop
		_ = srv.Close()
	}()
	_ = srv.Serve(ln)
	return 0
}

func identify(t *testing.T, addr string) replicaIdentity {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var id replicaIdentity
	if err := json.NewDecoder(resp.Body).Decode(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func processGone(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] == "Z"
}

// TestManagerWithLocalProcesses runs the manager against real replica processes: two READY,
// one killed and replaced with a new id, then Shutdown leaves no process.
func TestManagerWithLocalProcesses(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	prov, err := local.New(local.Options{Dir: t.TempDir(), StopGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	task := &configs.Task{
		Name:    "it",
		Run:     "exec '" + exe + "' -test.run='^$'",
		Envs:    map[string]string{serverEnv: "1"},
		Secrets: map[string]string{"TOKEN": secretValue},
		Service: &configs.Service{
			Port:           8000,
			ReadinessProbe: configs.Probe{Path: "/health", InitialDelaySeconds: 120, TimeoutSeconds: 2},
		},
	}
	pubs := &publications{}
	m, err := New(Config{
		Service: "it", Version: 1, Task: task, Provider: prov, Store: newFakeStore(),
		OnReady: pubs.onReady, ProbeInterval: 200 * time.Millisecond, ReconcileInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start = %v", err)
		}
	}()

	m.SetDesired(2)
	waitPublished := func(want ...int) []Endpoint {
		t.Helper()
		var last []Endpoint
		eventually(t, fmt.Sprintf("READY set %v", want), func() bool {
			last, _ = pubs.last()
			return fmt.Sprint(ids(last)) == fmt.Sprint(want)
		})
		return last
	}
	ready := waitPublished(1, 2)
	var pids []int
	for _, ep := range ready {
		id := identify(t, ep.Addr)
		if id.ReplicaID != strconv.Itoa(ep.ReplicaID) {
			t.Errorf("replica at %s says it is %q, want %d", ep.Addr, id.ReplicaID, ep.ReplicaID)
		}
		pids = append(pids, id.PID)
	}

	victim := identify(t, ready[0].Addr)
	if err := syscall.Kill(-victim.PGID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ready = waitPublished(2, 3)
	pids = append(pids, identify(t, ready[1].Addr).PID)
	for _, r := range m.Replicas() {
		if r.ID == 1 && (r.Status != StatusFailed || r.Reason != "signal: killed") {
			t.Errorf("killed replica = %s %q, want FAILED \"signal: killed\"", r.Status, r.Reason)
		}
	}

	if _, err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if last, _ := pubs.last(); len(last) != 0 {
		t.Errorf("READY set after Shutdown = %v", ids(last))
	}
	left, err := prov.List(context.Background(), map[string]string{launcher.LabelService: "it"})
	if err != nil || len(left) != 0 {
		t.Errorf("instances after Shutdown = %v, %v", left, err)
	}
	for _, pid := range pids {
		if !processGone(pid) {
			t.Errorf("replica process %d survived Shutdown", pid)
		}
	}
	if pubs.overlap.Load() {
		t.Error("OnReady calls overlapped")
	}
}

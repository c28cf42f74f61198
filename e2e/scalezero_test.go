package e2e

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// minReplicasZero is SkyPilot's examples/serve/min_replicas_zero.yaml, its workdir the
// http_server stand-in in configs/testdata/skypilot.
const minReplicasZero = `# from skypilot-org/skypilot examples/serve/min_replicas_zero.yaml (Apache 2.0), workdir adapted
service:
  readiness_probe:
    path: /health
    initial_delay_seconds: 20
  replica_policy:
    min_replicas: 0
    max_replicas: 2
    target_qps_per_replica: 1

resources:
  ports: 8081
  cpus: 2+

workdir: configs/testdata/skypilot/http_server

run: python3 server.py --port 8081
`

// TestScaleToZeroFromTheStart: a SkyServe service with min_replicas: 0 under
// target_qps_per_replica starts with no replica, as SkyServe starts it (serve up asked the
// endpoint for its model, which was the request that launched one), and the first request
// launches one and is answered by it.
func TestScaleToZeroFromTheStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	file := filepath.Join(t.TempDir(), "min_replicas_zero.yaml")
	writeFile(t, file, minReplicasZero)
	out := e.mustRun("serve", "up", file, "-n", "zero", "-y")
	if !strings.Contains(out, "No replica runs yet") {
		t.Errorf("serve up does not say the service starts at zero:\n%s", out)
	}
	st, err := e.status("zero")
	if err != nil {
		t.Fatal(err)
	}
	if st.TargetReplicas != 0 || len(st.Replicas) != 0 {
		t.Fatalf("after serve up: target %d, replicas %+v; want none", st.TargetReplicas, st.Replicas)
	}
	// The first request wakes it: held until a replica is READY, then served.
	woke := time.Now()
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Get(st.Endpoint + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figure: the first request answered %v after it was sent (held while a replica launched from zero)", time.Since(woke).Round(10*time.Millisecond))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Hi, SkyPilot here!") {
		t.Fatalf("first request: %d %q", resp.StatusCode, body)
	}
	if st, err = e.status("zero"); err != nil || st.TargetReplicas != 1 || len(st.ready()) != 1 {
		t.Errorf("after the first request: %+v, %v; want one READY replica", st, err)
	}
}

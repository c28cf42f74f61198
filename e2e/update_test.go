package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// updateYAML is a two-replica service whose model name tells which version answered.
const updateYAML = `name: upd
resources:
  infra: local
  ports: 8080
envs:
  MODEL: %s
secrets:
  UPD_SECRET: %s
run: %s
service:
  replicas: 2
  load_balancing_policy: %s
  readiness_probe:
    path: /health
    initial_delay_seconds: 60
  update:
    min_healthy_seconds: 1
`

const simRun = "ferry replica-sim --port $FERRY_PORT --model $MODEL --startup-delay 1s"

func writeVersion(t *testing.T, dir, name, model, run, policy string) string {
	t.Helper()
	file := filepath.Join(dir, name+".yaml")
	writeFile(t, file, fmt.Sprintf(updateYAML, model, "s3cr3t-value", run, policy))
	return file
}

// servedModel asks the endpoint which model it serves (a replica answers /v1/models), so the
// model name tells which version answered.
func servedModel(t *testing.T, endpoint string) string {
	t.Helper()
	resp, err := http.Get(endpoint + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d: %s", resp.StatusCode, raw)
	}
	var got struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || len(got.Data) != 1 {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return got.Data[0].ID
}

// askWithID sends a small completion tagged with request id id; the access log then says
// which replica served it.
func askWithID(t *testing.T, endpoint, model, id string) {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	req, _ := http.NewRequest(http.MethodPost, endpoint+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d: %s", resp.StatusCode, raw)
	}
}

// TestServeUpdate walks a service through the update paths a user meets: a rolling update that
// relaunches, one that only changes the service section (relabelled, not relaunched), and one
// to a version that crashes (rolled back, with the reason in serve status). Traffic during
// updates is the bench/updates driver's job; this test checks what each path leaves behind.
func TestServeUpdate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	e.mustRun("serve", "up", writeVersion(t, dir, "v1", "upd-v1", simRun, "least_load"), "-y")
	endpoint := strings.TrimSpace(e.mustRun("serve", "status", "upd", "--endpoint"))
	if m := servedModel(t, endpoint); m != "upd-v1" {
		t.Fatalf("version 1 serves model %q", m)
	}

	// A new program: relaunched, one replica at a time.
	out := e.mustRun("serve", "update", "upd", writeVersion(t, dir, "v2", "upd-v2", simRun, "least_load"), "-y")
	if !strings.Contains(out, "Version 2 of \"upd\" is serving") || strings.Contains(out, "s3cr3t") {
		t.Fatalf("serve update v2 output:\n%s", out)
	}
	st, err := e.status("upd")
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "only version 2 replicas left", func() (bool, string) {
		st, err = e.status("upd")
		if err != nil {
			return false, err.Error()
		}
		for _, r := range st.Replicas {
			if r.Version != 2 {
				return false, fmt.Sprintf("%+v", st.Replicas)
			}
		}
		return len(st.ready()) == 2, fmt.Sprintf("%+v", st.Replicas)
	})
	if st.Version != 2 || st.Update == nil || st.Update.State != "SUCCEEDED" {
		t.Fatalf("status after update: version %d, update %+v", st.Version, st.Update)
	}
	for range 10 {
		if m := servedModel(t, endpoint); m != "upd-v2" {
			t.Fatalf("after the rolling update model %q answered", m)
		}
	}
	ids := func(st serviceStatus) []int {
		var out []int
		for id := range st.ready() {
			out = append(out, id)
		}
		slices.Sort(out)
		return out
	}
	before := ids(st)

	// Only the service section: the same replicas become version 3.
	e.mustRun("serve", "update", "upd", writeVersion(t, dir, "v3", "upd-v2", simRun, "round_robin"), "-y")
	st, err = e.status("upd")
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(st); !slices.Equal(got, before) {
		t.Errorf("a service-only update relaunched replicas: READY %v, before %v", got, before)
	}
	for _, r := range st.Replicas {
		if r.Version != 3 {
			t.Errorf("replica %d is version %d after a relabelling update, want 3", r.ID, r.Version)
		}
	}
	if st.Policy != "round_robin" {
		t.Errorf("load_balancing_policy = %q after the update, want round_robin", st.Policy)
	}
	if log := e.mustRun("serve", "logs", "upd", "--controller"); !strings.Contains(log, `"msg":"proxy settings replaced","service":"upd","policy":"round_robin"`) {
		t.Error("the endpoint's proxy was not replaced with the new policy")
	}
	// Round robin alternates between the two replicas even for sequential requests.
	for i := range 4 {
		askWithID(t, endpoint, "upd-v2", fmt.Sprintf("rr-check-%d", i))
	}
	seen := map[float64]bool{}
	for _, line := range strings.Split(e.mustRun("serve", "logs", "upd", "--controller"), "\n") {
		var l struct {
			RequestID string  `json:"request_id"`
			ReplicaID float64 `json:"replica_id"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.RequestID, "rr-check-") {
			seen[l.ReplicaID] = true
		}
	}
	if len(seen) != 2 {
		t.Errorf("4 sequential requests under round_robin reached replicas %v, want both", seen)
	}

	// A version whose replicas crash: rolled back to 3, which never stopped serving.
	_, errOut, err := e.run("serve", "update", "upd", writeVersion(t, dir, "bad", "upd-bad", `"sleep 0.5; exit 3"`, "round_robin"), "-y")
	if err == nil || !strings.Contains(errOut, "version 3 serves again") {
		t.Fatalf("update to a crashing version: err %v, stderr:\n%s", err, errOut)
	}
	table := e.mustRun("serve", "status", "upd")
	if !strings.Contains(table, "ROLLED BACK to 3") || !strings.Contains(table, "exit status 3") {
		t.Errorf("serve status does not say the update was rolled back and why:\n%s", table)
	}
	st, _ = e.status("upd")
	if st.Version != 3 || st.Update == nil || st.Update.State != "ROLLED_BACK" {
		t.Errorf("status after rollback: version %d, update %+v", st.Version, st.Update)
	}
	if got := ids(st); !slices.Equal(got, before) {
		t.Errorf("rollback disturbed the serving replicas: READY %v, before %v", got, before)
	}
	for range 10 {
		if m := servedModel(t, endpoint); m != "upd-v2" {
			t.Fatalf("after the rollback model %q answered", m)
		}
	}

	e.mustRun("serve", "down", "upd", "-y")
	if pids := e.replicaPIDs(); len(pids) != 0 {
		t.Errorf("replica processes left after serve down: %v", pids)
	}
	if log, _, _ := e.run("serve", "logs", "upd", "--controller"); strings.Contains(log, "s3cr3t") {
		t.Error("the controller log holds a secret value")
	}
}

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// serviceStatus is the part of `serve status --json` the tests read.
type serviceStatus struct {
	Name           string `json:"name"`
	Status         string `json:"status"`
	Endpoint       string `json:"endpoint"`
	TargetReplicas int    `json:"target_replicas"`
	ReadyReplicas  int    `json:"ready_replicas"`
	Version        int    `json:"version"`
	Policy         string `json:"load_balancing_policy"`
	Update         *struct {
		From   int    `json:"from"`
		To     int    `json:"to"`
		State  string `json:"state"`
		Reason string `json:"reason"`
	} `json:"update"`
	Replicas []struct {
		ID         int     `json:"id"`
		Version    int     `json:"version"`
		Status     string  `json:"status"`
		Endpoint   string  `json:"endpoint"`
		InstanceID string  `json:"instance_id"`
		Infra      string  `json:"infra"`
		Zone       string  `json:"zone"`
		Spot       bool    `json:"spot"`
		Price      float64 `json:"price_per_hour"`
	} `json:"replicas"`
}

func (e *env) status(name string) (serviceStatus, error) {
	out, errOut, err := e.run("serve", "status", name, "--json")
	if err != nil {
		return serviceStatus{}, fmt.Errorf("%v: %s", err, errOut)
	}
	var list []serviceStatus
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return serviceStatus{}, fmt.Errorf("decode %q: %v", out, err)
	}
	if len(list) != 1 {
		return serviceStatus{}, fmt.Errorf("want 1 service, got %d", len(list))
	}
	return list[0], nil
}

// readyReplicas returns the ids and endpoints of READY replicas.
func (st serviceStatus) ready() map[int]string {
	out := map[int]string{}
	for _, r := range st.Replicas {
		if r.Status == "READY" {
			out[r.ID] = r.Endpoint
		}
	}
	return out
}

// replicaPIDs maps each live local instance to the pid of its process group leader, read from
// the local provider's metadata.
func (e *env) replicaPIDs() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	matches, _ := filepath.Glob(filepath.Join(e.home, "local", "*", "instance.json"))
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var meta struct {
			ID  string `json:"id"`
			PID int    `json:"pid"`
		}
		if json.Unmarshal(b, &meta) == nil && meta.PID > 0 && alive(meta.PID) {
			out[meta.ID] = meta.PID
		}
	}
	return out
}

func chatPlain(t *testing.T, endpoint string) {
	t.Helper()
	body := `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"Hello from curl"}],"max_tokens":8}`
	resp, err := http.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("chat completion: HTTP %d: %s", resp.StatusCode, raw)
	}
	var got struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	if got.Object != "chat.completion" || len(got.Choices) != 1 || got.Choices[0].Message.Content == "" ||
		got.Usage.CompletionTokens != 8 || got.Usage.PromptTokens == 0 {
		t.Fatalf("unexpected completion: %s", raw)
	}
}

func chatStream(t *testing.T, endpoint string) {
	t.Helper()
	body := `{"model":"ferry-sim-1b","messages":[{"role":"user","content":"Stream please"}],"max_tokens":5,"stream":true}`
	resp, err := http.Post(endpoint+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: HTTP %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, line)
		}
	}
	if len(events) < 6 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream events: want >= 5 chunks then [DONE], got %q", events)
	}
}

func openAISDK(t *testing.T, endpoint string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := openai.NewClient(option.WithBaseURL(endpoint+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{
		Model:     "ferry-sim-1b",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello from the OpenAI Go SDK")},
		MaxTokens: openai.Int(6),
	}
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatalf("SDK chat: %v", err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.CompletionTokens != 6 {
		t.Fatalf("SDK chat: unexpected %+v", resp)
	}

	params.StreamOptions.IncludeUsage = openai.Bool(true)
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("SDK stream: %v", err)
	}
	if chunks < 6 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens != 6 {
		t.Fatalf("SDK stream: %d chunks, accumulated %+v", chunks, acc.ChatCompletion)
	}
}

// TestQuickstartLifecycle is the README's quickstart, then every failure the walking skeleton
// promises to survive: a killed replica, a SIGKILLed controller, and a clean serve down.
func TestQuickstartLifecycle(t *testing.T) {
	e := newEnv(t)
	out := e.mustRun("serve", "up", "configs/examples/quickstart.yaml", "-y")
	for _, want := range []string{"Considered resources", "Endpoint: http://", "2/2 READY"} {
		if !strings.Contains(out, want) {
			t.Fatalf("serve up output lacks %q:\n%s", want, out)
		}
	}
	endpoint := strings.TrimSpace(e.mustRun("serve", "status", "quickstart", "--endpoint"))
	if !strings.HasPrefix(endpoint, "http://127.0.0.1:") {
		t.Fatalf("endpoint %q", endpoint)
	}

	t.Run("curl plain and streamed", func(t *testing.T) {
		chatPlain(t, endpoint)
		chatStream(t, endpoint)
	})
	t.Run("official OpenAI SDK", func(t *testing.T) { openAISDK(t, endpoint) })

	table := e.mustRun("serve", "status")
	if n := strings.Count(table, "READY"); n < 3 { // the service line and two replica lines
		t.Fatalf("serve status shows %d READY, want the service and 2 replicas:\n%s", n, table)
	}

	st, err := e.status("quickstart")
	if err != nil {
		t.Fatal(err)
	}
	before := st.ready()
	if len(before) != 2 {
		t.Fatalf("want 2 READY replicas, got %+v", st)
	}

	t.Run("replica logs", func(t *testing.T) {
		var id int
		for id = range before {
			break
		}
		out := e.mustRun("serve", "logs", "quickstart", fmt.Sprint(id), "--tail", "1")
		if !strings.Contains(out, "serving model") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Fatalf("serve logs --tail 1: want replica-sim's one start-up line, got:\n%s", out)
		}
		if _, errOut, err := e.run("serve", "logs", "quickstart", "999"); err == nil || !strings.Contains(errOut, "999") {
			t.Fatalf("logs of an unknown replica: err %v, stderr %q", err, errOut)
		}
	})

	t.Run("killed replica is replaced", func(t *testing.T) {
		pids := e.replicaPIDs()
		if len(pids) != 2 {
			t.Fatalf("want 2 live replica processes, got %v", pids)
		}
		var victim int
		for _, pid := range pids {
			victim = pid
			break
		}
		if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		maxOld := 0
		for id := range before {
			maxOld = max(maxOld, id)
		}
		eventually(t, 90*time.Second, "a new replica READY in place of the killed one", func() (bool, string) {
			st, err := e.status("quickstart")
			if err != nil {
				return false, err.Error()
			}
			ready := st.ready()
			newOne := false
			for id := range ready {
				if id > maxOld {
					newOne = true
				}
			}
			return len(ready) == 2 && newOne, fmt.Sprintf("%+v", st.Replicas)
		})
		chatPlain(t, endpoint)
	})

	t.Run("SIGKILLed controller restarts and adopts", func(t *testing.T) {
		pidsBefore := e.replicaPIDs()
		ctrl := e.controllerPID()
		if err := syscall.Kill(ctrl, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "controller gone", func() (bool, string) { return !alive(ctrl), "alive" })
		// Any CLI command brings the controller back.
		var st serviceStatus
		eventually(t, 60*time.Second, "service READY again after restart", func() (bool, string) {
			var err error
			st, err = e.status("quickstart")
			if err != nil {
				return false, err.Error()
			}
			return len(st.ready()) == 2, fmt.Sprintf("%+v", st)
		})
		if newCtrl := e.controllerPID(); newCtrl == ctrl {
			t.Fatalf("controller pid unchanged (%d)", ctrl)
		}
		if st.Endpoint != endpoint {
			t.Fatalf("endpoint changed across restart: %s -> %s", endpoint, st.Endpoint)
		}
		pidsAfter := e.replicaPIDs()
		if fmt.Sprint(pidsAfter) != fmt.Sprint(pidsBefore) {
			t.Fatalf("replicas were not adopted as the same processes: before %v, after %v", pidsBefore, pidsAfter)
		}
		chatPlain(t, endpoint)
	})

	t.Run("serve down leaves nothing behind", func(t *testing.T) {
		st, err := e.status("quickstart")
		if err != nil {
			t.Fatal(err)
		}
		pids := e.replicaPIDs()
		var replicaAddrs []string
		for _, r := range st.Replicas {
			if r.Endpoint != "" && r.Status == "READY" {
				replicaAddrs = append(replicaAddrs, r.Endpoint)
				// The check below can fail: each READY replica accepts now.
				if !replicaListening(t, e, r.Endpoint) {
					t.Fatalf("READY replica %s accepts no connection before serve down", r.Endpoint)
				}
			}
		}
		out := e.mustRun("serve", "down", "quickstart", "-y")
		if !strings.Contains(out, "is down") {
			t.Fatalf("serve down output:\n%s", out)
		}
		for id, pid := range pids {
			if alive(pid) {
				t.Errorf("replica %s (pid %d) still running after serve down", id, pid)
			}
		}
		addr := strings.TrimPrefix(endpoint, "http://")
		if listening(addr) {
			t.Errorf("endpoint %s still accepts connections", addr)
		}
		for _, a := range replicaAddrs {
			if replicaListening(t, e, a) {
				t.Errorf("replica port %s still accepts connections", a)
			}
		}
		if left := e.replicaPIDs(); len(left) != 0 {
			t.Errorf("local instances left: %v", left)
		}
		if _, err := e.status("quickstart"); err == nil {
			t.Errorf("serve status still knows the service after serve down")
		}
		// Stopping the controller releases its lock: a new process can take it at once.
		e.mustRun("controller", "stop")
		f, err := os.OpenFile(filepath.Join(e.home, "controller.lock"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Errorf("controller lock still held after stop: %v", err)
		}
	})
}

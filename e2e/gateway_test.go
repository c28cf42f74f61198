package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/testhttp"
)

// TestGatewayAuthAndTLS: two services behind one controller. One requires an API key and
// serves HTTPS; the other is open. The shared gateway routes by model and lists only what the
// caller may see; the controller's metrics listener counts every service's requests and its log
// has an access line per request; and the key appears nowhere a user or operator can read.
func TestGatewayAuthAndTLS(t *testing.T) {
	t.Parallel()
	const key = "sk-ferry-e2e-0123456789abcdef"
	e := newEnv(t)
	gatewayAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dir := t.TempDir()
	// The metrics listener wants a bearer token, as a Prometheus scrape config's
	// credentials_file sends it.
	const metricsToken = "ferry-e2e-metrics-token-0123456789"
	tokenFile := filepath.Join(dir, "metrics.token")
	writeFile(t, tokenFile, metricsToken+"\n")
	e.extraEnv = []string{"FERRY_GATEWAY_ADDR=" + gatewayAddr, "FERRY_METRICS_ADDR=" + metricsAddr, "FERRY_E2E_KEY=" + key,
		"FERRY_METRICS_TOKEN_FILE=" + tokenFile}
	certFile, keyFile := testhttp.WriteSelfSigned(t, dir)

	private := filepath.Join(dir, "private.yaml")
	writeFile(t, private, `name: private
run: ferry replica-sim --port $FERRY_PORT --model acme/private-8b
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
  auth:
    keys_from_env: [FERRY_E2E_KEY]
  tls:
    certfile: `+certFile+`
    keyfile: `+keyFile+`
  limits:
    max_concurrent_requests: 64
`)
	open := filepath.Join(dir, "open.yaml")
	writeFile(t, open, `name: open
run: ferry replica-sim --port $FERRY_PORT --model acme/open-1b
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
`)
	var seen strings.Builder
	seen.WriteString(e.mustRun("serve", "up", private, "-y"))
	upOpen := e.mustRun("serve", "up", open, "-y")
	seen.WriteString(upOpen)

	privateEP := strings.TrimSpace(e.mustRun("serve", "status", "private", "--endpoint"))
	if !strings.HasPrefix(privateEP, "https://127.0.0.1:") {
		t.Fatalf("private endpoint %q, want https", privateEP)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // the certificate is self-signed
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	chat := func(url, model, auth string) (int, string) {
		t.Helper()
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":4}`, model)
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}

	if code, body := chat(privateEP, "acme/private-8b", ""); code != 401 || !strings.Contains(body, "invalid_api_key") {
		t.Errorf("private endpoint without a key: %d %s", code, body)
	}
	if code, body := chat(privateEP, "acme/private-8b", key); code != 200 {
		t.Errorf("private endpoint with the key: %d %s", code, body)
	}

	gw := "http://" + gatewayAddr
	metricsURL := "http://" + metricsAddr + "/metrics"
	ctl := e.mustRun("controller", "status")
	if !strings.Contains(ctl, gw) {
		t.Errorf("controller status does not show the gateway %s:\n%s", gw, ctl)
	}
	if !strings.Contains(ctl, "metrics:  "+metricsURL+"\n") {
		t.Errorf("controller status does not show the metrics URL %s:\n%s", metricsURL, ctl)
	}
	if !strings.Contains(upOpen, "Metrics:  "+metricsURL) {
		t.Errorf("serve up does not show the metrics URL %s:\n%s", metricsURL, upOpen)
	}
	models := func(auth string) []string {
		req, _ := http.NewRequest(http.MethodGet, gw+"/v1/models", nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		slices.Sort(ids)
		return ids
	}
	eventually(t, time.Minute, "the gateway to learn both services' models", func() (bool, string) {
		got := models(key)
		return slices.Equal(got, []string{"acme/open-1b", "acme/private-8b", "open", "private"}), fmt.Sprint(got)
	})
	if got := models(""); !slices.Equal(got, []string{"acme/open-1b", "open"}) {
		t.Errorf("without a key the gateway lists %v, want only the open service's models", got)
	}
	if code, body := chat(gw, "acme/open-1b", ""); code != 200 || !strings.Contains(body, "acme/open-1b") {
		t.Errorf("gateway → open: %d %s", code, body)
	}
	if code, body := chat(gw, "acme/private-8b", key); code != 200 || !strings.Contains(body, "acme/private-8b") {
		t.Errorf("gateway → private with key: %d %s", code, body)
	}
	if code, body := chat(gw, "acme/private-8b", ""); code != 401 {
		t.Errorf("gateway → private without key: %d %s", code, body)
	}
	// Without any service's key an unknown model looks like a protected one; with a key, like
	// a model the caller may not use.
	if code, body := chat(gw, "nonexistent/model", ""); code != 401 || !strings.Contains(body, "invalid_api_key") {
		t.Errorf("gateway → unknown model without a key: %d %s", code, body)
	}
	if code, body := chat(gw, "nonexistent/model", key); code != 404 || !strings.Contains(body, "model_not_found") {
		t.Errorf("gateway → unknown model with a key: %d %s", code, body)
	}

	// Each service counts the requests it answered, direct or via the gateway: private 200 once
	// each way with the key and 401 once each way without, open 200 once via the gateway; the
	// gateway counts the unknown model it answered itself.
	scrape := func(auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, metricsURL, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	for _, auth := range []string{"", "Bearer wrong-token-0123456789"} {
		if code, body := scrape(auth); code != http.StatusUnauthorized || strings.Contains(body, "ferry_requests_total") {
			t.Errorf("/metrics with Authorization %q: %d, want 401 without metrics", auth, code)
		}
	}
	var metrics string
	eventually(t, 10*time.Second, "/metrics to count both services' requests", func() (bool, string) {
		var code int
		if code, metrics = scrape("Bearer " + metricsToken); code != http.StatusOK {
			return false, fmt.Sprintf("HTTP %d: %s", code, metrics)
		}
		ok := sumSeries(metrics, "ferry_requests_total", `code="200"`, `service="private"`) >= 2 &&
			sumSeries(metrics, "ferry_requests_total", `code="200"`, `service="open"`) >= 1 &&
			sumSeries(metrics, "ferry_requests_total", `code="401"`, `service="private"`) >= 1 &&
			sumSeries(metrics, "ferry_gateway_errors_total", `code="404"`, `reason="unknown_model"`) >= 1
		return ok, grepLines(metrics, "ferry_requests_total") + "\n" + grepLines(metrics, "ferry_gateway_errors_total")
	})
	if !strings.Contains(metrics, "\ngo_goroutines ") {
		t.Errorf("/metrics has no Go runtime metrics:\n%s", metrics)
	}
	if got := testhttp.GetOK(t, client, "http://"+metricsAddr+"/healthz"); got != "ok\n" {
		t.Errorf("/healthz = %q", got)
	}
	seen.WriteString(metrics)

	ctlLog, err := os.ReadFile(filepath.Join(e.home, "controller.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := accessLines(string(ctlLog), "private"); n == 0 {
		t.Errorf("controller.log has no access line with a request_id for service private:\n%s", lastLines(string(ctlLog), 40))
	}
	seen.Write(ctlLog)

	seen.WriteString(e.mustRun("serve", "status", "-v"))
	seen.WriteString(e.mustRun("serve", "status", "--json"))
	seen.WriteString(e.mustRun("serve", "logs", "private", "--controller"))
	db, err := os.ReadFile(filepath.Join(e.home, "ferry.db"))
	if err != nil {
		t.Fatal(err)
	}
	seen.Write(db)
	if strings.Contains(seen.String(), key) {
		t.Fatalf("the API key reached CLI output, the controller log, /metrics or the store")
	}
	if strings.Contains(seen.String(), metricsToken) {
		t.Fatalf("the metrics token reached CLI output, the controller log, /metrics or the store")
	}
}

// sumSeries adds up the samples of metric, in the Prometheus text format, whose labels
// contain every one of labels (each `name="value"`).
func sumSeries(text, metric string, labels ...string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, metric+"{")
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		all := true
		for _, l := range labels {
			all = all && slices.Contains(strings.Split(set, ","), l)
		}
		if v, err := strconv.ParseFloat(strings.Fields(value)[0], 64); all && err == nil {
			sum += v
		}
	}
	return sum
}

// accessLines counts the controller log's access lines (logger "access", message "request") for
// service that carry a request id.
func accessLines(log, service string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		var entry struct {
			Logger    string `json:"logger"`
			Msg       string `json:"msg"`
			Service   string `json:"service"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue
		}
		if entry.Logger == "access" && entry.Msg == "request" && entry.Service == service && entry.RequestID != "" {
			n++
		}
	}
	return n
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

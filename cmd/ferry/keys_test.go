package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/controller"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/tenants"
)

// tenantsController runs a controller in this process on h until the test ends or stop is
// called; its logs, at every level, are in logs.
func tenantsController(t *testing.T, h home.Home) (ctl *controller.Controller, logs *observer.ObservedLogs, stop func()) {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	ctl = controller.New(controller.Options{Home: h, GatewayAddr: controller.ListenerOff, MetricsAddr: controller.ListenerOff,
		UsagePersistInterval: 50 * time.Millisecond, Logger: zap.New(core)})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- ctl.Start(ctx) }()
	var once bool
	stop = func() {
		if once {
			return
		}
		once = true
		cancel()
		select {
		case err := <-stopped:
			if err != nil {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the controller did not stop within a minute")
		}
	}
	t.Cleanup(stop)
	eventually(t, time.Minute, "the controller answers", func() (bool, string) {
		_, _, err := connect(ctx, h)
		return err == nil, fmt.Sprint(err)
	})
	return ctl, logs, stop
}

func mustRun(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := ferryRun(ctx, t, args...)
	if err != nil {
		t.Fatalf("ferry %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestKeysAndUsageCLI drives `ferry keys` and `ferry usage` against a controller in this
// process: a key's secret is shown once and kept nowhere (not in the store, not in a log), list
// and revoke find keys by name, bad input is refused naming the field, usage reported through the
// hub is persisted, grouped, exported as CSV, and kept across a restart of the controller,
// whose hub loads it again.
func TestKeysAndUsageCLI(t *testing.T) {
	dir := t.TempDir()
	h := home.Home{Dir: filepath.Join(dir, "home")}
	t.Setenv(home.Env, h.Dir)
	t.Setenv("KUBECONFIG", filepath.Join(dir, "no-kubeconfig"))
	if err := h.Ensure(); err != nil {
		t.Fatal(err)
	}
	ctl, logs, stop := tenantsController(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	out := mustRun(ctx, t, "keys", "create", "alice", "--team", "eng", "--service", "chat", "--rpm", "60", "--tpd", "2000000",
		"--priority", "interactive", "--expires", "30d")
	m := regexp.MustCompile(`Created key alice \((key_[0-9a-f]{12})\), team eng\.\n\n  (fy-[0-9A-Za-z]{40})\n`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "it will not be shown again") {
		t.Fatalf("create did not show the id and the secret once, with the warning:\n%s", out)
	}
	aliceID, aliceSecret := m[1], m[2]
	var bob api.CreatedKey
	if err := json.Unmarshal([]byte(mustRun(ctx, t, "keys", "create", "bob", "--budget-usd", "5", "--json")), &bob); err != nil || bob.Secret == "" {
		t.Fatalf("create --json: %+v, %v", bob, err)
	}

	out = mustRun(ctx, t, "keys", "list")
	aliceLine := regexp.MustCompile(`(?m)^` + aliceID + `\s+alice\s+eng\s+fy-\S+…\s+services=chat\s+interactive\s+60rpm 2Mtpd\s+\d{4}-\d\d-\d\d \d\d:\d\d\s+active$`)
	if !aliceLine.MatchString(out) || !strings.Contains(out, "$5/month") {
		t.Errorf("keys list lacks alice's line or bob's budget:\n%s", out)
	}
	out = mustRun(ctx, t, "keys", "list", "--json")
	var list []api.KeyInfo
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 2 || strings.Contains(out, aliceSecret) ||
		strings.Contains(out, tenants.HashSecret(aliceSecret)) {
		t.Errorf("keys list --json: %v; want two keys, no secret, no hash:\n%s", err, out)
	}

	checkRefusals(ctx, t)
	mustRun(ctx, t, "keys", "update", "alice", "--rpm", "0", "--rpd", "500")
	if out := mustRun(ctx, t, "keys", "list"); !strings.Contains(out, "500rpd 2Mtpd") {
		t.Errorf("update did not lift the rpm and set the rpd:\n%s", out)
	}
	mustRun(ctx, t, "keys", "prices", "set", "llama", "--input-per-million", "1", "--output-per-million", "2")
	mustRun(ctx, t, "keys", "teams", "set", "eng", "--rpd", "1000")
	if out := mustRun(ctx, t, "keys", "teams", "list"); !regexp.MustCompile(`(?m)^eng\s+1krpd$`).MatchString(out) {
		t.Errorf("teams list:\n%s", out)
	}
	if out := mustRun(ctx, t, "keys", "prices", "list"); !regexp.MustCompile(`llama\s+1\s+2`).MatchString(out) {
		t.Errorf("prices list:\n%s", out)
	}

	// Use as the proxies report it: alice today on llama, bob yesterday.
	now := time.Now()
	today := tenants.DayOf(now)
	price := tenants.Price{InputPerMillion: 1, OutputPerMillion: 2}
	ctl.TenantHub().Sync(tenants.SyncRequest{Proxy: "test", Rows: []tenants.Row{
		{KeyID: aliceID, Team: "eng", Service: "chat", Model: "llama", Day: today, Totals: tenants.Totals{Requests: 3, Errors: 1, Input: 1000, Output: 500, CostMicros: price.CostMicros(1000, 500)}},
		{KeyID: bob.ID, Service: "chat", Model: "bge", Day: today - 1, Totals: tenants.Totals{Requests: 7, Input: 70}},
	}}, now)
	mustRun(ctx, t, "keys", "revoke", "alice")
	out = mustRun(ctx, t, "usage", "--since", "7d")
	if !regexp.MustCompile(`alice \(`+aliceID+`\)\s+3\s+1\s+1000\s+500\s+0\.0020`).MatchString(out) ||
		!regexp.MustCompile(`TOTAL\s+10\s+1\s+1070\s+500\s+0\.0020`).MatchString(out) {
		t.Errorf("usage by key:\n%s", out)
	}
	if out := mustRun(ctx, t, "usage", "--since", "7d", "--by", "model"); !regexp.MustCompile(`(?m)^\s*bge\s+7\s+0\s+70\s+0\s+0\.00`).MatchString(out) {
		t.Errorf("usage by model:\n%s", out)
	}
	wantCSV := "day,key_id,key_name,team,service,model,requests,errors,input_tokens,output_tokens,cost_usd\n" +
		fmt.Sprintf("%s,%s,bob,,chat,bge,7,0,70,0,0.000000\n", today-1, bob.ID) +
		fmt.Sprintf("%s,%s,alice,eng,chat,llama,3,1,1000,500,0.002000\n", today, aliceID)
	if out := mustRun(ctx, t, "usage", "--since", (today - 1).String(), "--csv"); out != wantCSV {
		t.Errorf("usage --csv:\n%s\nwant:\n%s", out, wantCSV)
	}

	// A restarted controller reads the usage back, and its hub counts today's again.
	stop()
	ctl, logs2, _ := tenantsController(t, h)
	if out := mustRun(ctx, t, "usage", "--since", (today - 1).String(), "--csv"); out != wantCSV {
		t.Errorf("usage --csv after a restart:\n%s\nwant:\n%s", out, wantCSV)
	}
	ans := ctl.TenantHub().Sync(tenants.SyncRequest{Proxy: "test"}, time.Now())
	found := false
	for _, g := range ans.Accounts {
		found = found || (g.Account == tenants.KeyAccount(aliceID) && g.DayUsed.Requests == 3 && g.MonthCost == 2000)
	}
	if !found {
		t.Errorf("the restarted hub's accounts %+v lack alice's 3 requests and 2000 micro-dollars", ans.Accounts)
	}
	checkNoSecret(t, h, []string{aliceSecret, bob.Secret}, logs, logs2)
}

// checkRefusals: bad input fails with what is wrong, and changes nothing.
func checkRefusals(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "create", "carol", "--rpm", "-1"}, "requests_per_minute is -1"},
		{[]string{"keys", "create", "carol", "--priority", "urgent"}, `priority "urgent"`},
		{[]string{"keys", "create", "carol", "--budget-period", "week"}, `budget_period "week"`},
		{[]string{"keys", "create", "carol", "--expires", "someday"}, `--expires "someday"`},
		{[]string{"keys", "create", "alice"}, `a key named "alice" exists`},
		{[]string{"keys", "create", "bad name"}, `name "bad name"`},
		{[]string{"keys", "revoke", "nobody"}, `no key has the id or name "nobody"`},
		{[]string{"keys", "update", "alice"}, "nothing to change"},
		{[]string{"keys", "update", "nobody", "--rpm", "1"}, `no key has the id or name "nobody"`},
		{[]string{"keys", "teams", "set", "eng", "--tpm", "-4"}, "total_tokens_per_minute is -4"},
		{[]string{"keys", "prices", "set", "llama", "--input-per-million", "-1"}, "input_per_million is -1"},
		{[]string{"keys", "prices", "delete", "nothing"}, `no price for model "nothing"`},
		{[]string{"usage", "--since", "last week"}, `--since "last week"`},
		{[]string{"usage", "--by", "colour"}, `by "colour"`},
		{[]string{"usage", "--by", "team", "--csv"}, "drop --by"},
	} {
		out, err := ferryRun(ctx, t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ferry %s: %v (%s), want an error saying %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
	out := mustRun(ctx, t, "keys", "list", "--json")
	if strings.Contains(out, "carol") {
		t.Errorf("a refused key was kept:\n%s", out)
	}
}

// checkNoSecret: no secret is in the home's files (the store among them) or in a log line.
func checkNoSecret(t *testing.T, h home.Home, secrets []string, logs ...*observer.ObservedLogs) {
	t.Helper()
	err := filepath.WalkDir(h.Dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&os.ModeSocket != 0 {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, s := range secrets {
			if strings.Contains(string(b), s) {
				t.Errorf("%s holds a key's secret", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logs {
		for _, e := range l.All() {
			line := fmt.Sprintf("%s %v", e.Message, e.ContextMap())
			for _, s := range secrets {
				if strings.Contains(line, s) {
					t.Errorf("a log line holds a key's secret: %s", line)
				}
			}
		}
	}
}

// TestUsageCSVKeepsFormulasAsText: a model name a client chose cannot become a spreadsheet
// formula in the billing export.
func TestUsageCSVKeepsFormulasAsText(t *testing.T) {
	var b strings.Builder
	rep := api.UsageReport{Lines: []api.UsageLine{{Day: "2026-11-30", KeyID: "key_1", KeyName: "k", Service: "s", Model: "=HYPERLINK(\"x\")"}}}
	if err := writeUsageCSV(&b, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"'=HYPERLINK(""x"")"`) {
		t.Errorf("export:\n%s\nwant the model quoted as text", b.String())
	}
	if cellText("llama-3") != "llama-3" || cellText("-1") != "'-1" || cellText("") != "" {
		t.Error("cellText")
	}
}

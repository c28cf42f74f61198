package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCredentialEnvsNeverShown: values written under envs with a credential's name (HF_TOKEN in
// the YAML, OPENAI_API_KEY given with --env) are shown by no output a user or an operator
// reads (--dry-run's resolved YAML, serve up, status, status --json, the logs, the controller
// log) and are not in clear in ferry.db, while the replica gets them: it becomes READY only if
// it sees both.
func TestCredentialEnvsNeverShown(t *testing.T) {
	e := newEnv(t)
	const (
		hfToken = "hf_EnvWrittenToken_5551212"
		apiKey  = "sk-EnvGivenKey-8675309"
	)
	// The run compares a hash, so that the task shows neither value.
	sum := sha256.Sum256([]byte(hfToken + apiKey))
	both := hex.EncodeToString(sum[:])
	yaml := `name: envcreds
envs:
  MODEL: ferry-sim-1b
  HF_TOKEN: ` + hfToken + `
run: test "$(printf %s "$HF_TOKEN$OPENAI_API_KEY" | sha256sum | cut -c1-64)" = ` + both + ` && exec ferry replica-sim --port $FERRY_PORT --model $MODEL
service:
  readiness_probe: /health
  replicas: 1
  ports: 8080
`
	file := filepath.Join(t.TempDir(), "envcreds.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	show := func(args ...string) string {
		t.Helper()
		out, errOut, err := e.run(args...)
		if err != nil {
			t.Fatalf("ferry %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, errOut)
		}
		seen.WriteString(out)
		seen.WriteString(errOut)
		return out
	}
	dry := show("serve", "up", file, "--env", "OPENAI_API_KEY="+apiKey, "--dry-run")
	if !strings.Contains(dry, "HF_TOKEN: <redacted>") || !strings.Contains(dry, "OPENAI_API_KEY: <redacted>") {
		t.Errorf("--dry-run should show both envs as <redacted>:\n%s", dry)
	}
	show("serve", "up", file, "--env", "OPENAI_API_KEY="+apiKey, "-y")
	show("serve", "status")
	show("serve", "status", "-v")
	status := show("serve", "status", "--json")
	if !strings.Contains(status, "READY") {
		t.Errorf("the replica is not READY: it did not get its envs\n%s", status)
	}
	show("serve", "logs", "envcreds", "1")
	show("serve", "logs", "envcreds", "--controller")
	for _, f := range []string{"controller.log", "ferry.db", "ferry.db-wal"} {
		b, err := os.ReadFile(filepath.Join(e.home, f))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		seen.Write(b)
	}
	for _, s := range []string{hfToken, apiKey} {
		if strings.Contains(seen.String(), s) {
			t.Errorf("%s reached user-visible output, the controller log or ferry.db in clear", s)
		}
	}
	assertOwnerOnly(t, e.home)
}

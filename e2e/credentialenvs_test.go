package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
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
	t.Parallel()
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
	// The local replica's script gets its environment from the process, not written out.
	scripts := mustGlob(t, filepath.Join(e.home, "local", "*", "run.sh"))
	if len(scripts) == 0 {
		t.Error("no replica script under FERRY_HOME/local")
	}
	for _, f := range scripts {
		b, _ := os.ReadFile(f)
		seen.Write(b)
	}
	for _, s := range []string{hfToken, apiKey} {
		if strings.Contains(seen.String(), s) {
			t.Errorf("%s reached user-visible output, the controller log, a replica script or ferry.db in clear", s)
		}
	}
	assertOwnerOnly(t, e.home)
}

// TestStoreKeyWrongOrMissing: with store.key replaced or removed, the CLI says the key is
// wrong or missing and what to do (the controller refuses to start: no panic, no new key, no
// secret lost); with the key back, the service and its secret are there.
func TestStoreKeyWrongOrMissing(t *testing.T) {
	e := newEnv(t)
	yaml := `name: keyed
secrets:
  HF_TOKEN: null
run: exec ferry replica-sim --port $FERRY_PORT
service:
  readiness_probe: /health
  replicas: 0
  ports: 8080
`
	file := filepath.Join(t.TempDir(), "keyed.yaml")
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	e.mustRun("serve", "up", file, "--secret", "HF_TOKEN=hf_keyed_secret", "-y")
	e.mustRun("controller", "stop")
	keyPath := filepath.Join(e.home, "store.key")
	key, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatalf("no store.key in FERRY_HOME: %v", err)
	}

	other := make([]byte, 32)
	_, _ = rand.Read(other)
	if err := os.WriteFile(keyPath, []byte(base64.StdEncoding.EncodeToString(other)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := e.run("serve", "status")
	if err == nil || !strings.Contains(errOut, keyPath+" is not the key the store's secrets were sealed with: restore that key file") || strings.Contains(errOut, "panic") {
		t.Errorf("with another key: %v\n%s", err, errOut)
	}
	if err := os.Remove(keyPath); err != nil {
		t.Fatal(err)
	}
	_, errOut, err = e.run("serve", "status")
	if err == nil || !strings.Contains(errOut, "which is missing: restore that file") {
		t.Errorf("without a key: %v\n%s", err, errOut)
	}
	if _, err := os.Stat(keyPath); err == nil {
		t.Error("a new store.key was made for a store sealed with another")
	}

	if err := os.WriteFile(keyPath, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := e.mustRun("serve", "status", "keyed"); !strings.Contains(out, "keyed") {
		t.Errorf("with the key back, status lacks the service:\n%s", out)
	}
}

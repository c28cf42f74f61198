package store

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/replicas"
)

// Values that must never be found in clear in the store's files.
const (
	secretHF     = "hf_sealed_secret_5150"
	secretAWS    = "aws/sealed+secret/8086"
	secretJobKey = "job-sealed-key-6502"
	envPassword  = "env-password-z80"
)

func secretTask(run string) *configs.Task {
	return &configs.Task{Run: run,
		Envs:    map[string]string{"MODEL": "llama-plain-model", "DB_PASSWORD": envPassword},
		Secrets: map[string]string{"HF_TOKEN": secretHF, "AWS_SECRET_ACCESS_KEY": secretAWS}}
}

// storeFiles is every byte of the database: the file, its WAL and shared memory.
func storeFiles(t *testing.T, path string) []byte {
	t.Helper()
	var all []byte
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		b, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

func fillStore(t *testing.T, s *SQLite) {
	t.Helper()
	if err := s.CreateService(Service{Name: "chat", Version: 1, Task: secretTask("serve v1"), Port: 1}); err != nil {
		t.Fatal(err)
	}
	v2 := replicas.Version{Number: 2, LaunchedAs: 2, Task: secretTask("serve v2")}
	if err := s.StartUpdate("chat", v2, replicas.Rollout{From: 1, To: 2}); err != nil {
		t.Fatal(err)
	}
	job := jobs.Job{Name: "train", State: jobs.Pending, Task: &configs.Task{Run: "train", Secrets: map[string]string{"JOB_KEY": secretJobKey}}}
	id, err := s.CreateJob(job)
	if err != nil {
		t.Fatal(err)
	}
	job.ID, job.State = id, jobs.Running
	if err := s.SaveJob(job); err != nil {
		t.Fatal(err)
	}
}

// checkReadsBack: every reader gives the values as written.
func checkReadsBack(t *testing.T, s *SQLite) {
	t.Helper()
	want := secretTask("serve v2")
	svc, err := s.GetService("chat")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, svc.Task); diff != "" {
		t.Errorf("GetService task (-want +got):\n%s", diff)
	}
	list, err := s.ListServices()
	if err != nil || len(list) != 1 {
		t.Fatalf("ListServices: %v, %v", list, err)
	}
	if diff := cmp.Diff(want, list[0].Task); diff != "" {
		t.Errorf("ListServices task (-want +got):\n%s", diff)
	}
	vs, err := s.Versions("chat")
	if err != nil || len(vs) != 2 {
		t.Fatalf("Versions: %v, %v", vs, err)
	}
	if diff := cmp.Diff(secretTask("serve v1"), vs[0].Task); diff != "" {
		t.Errorf("version 1 task (-want +got):\n%s", diff)
	}
	js, err := s.ListJobs()
	if err != nil || len(js) != 1 || js[0].Task.Secrets["JOB_KEY"] != secretJobKey {
		t.Errorf("ListJobs: %+v, %v; want the job's secret back", js, err)
	}
}

// TestSecretsSealedAtRest: secrets and credential-named envs are nowhere in clear in ferry.db
// (its WAL included), other envs stay readable with the sqlite3 shell, and every reader gets
// the values back.
func TestSecretsSealedAtRest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fillStore(t, s)
	raw := storeFiles(t, path)
	for _, v := range []string{secretHF, secretAWS, secretJobKey, envPassword} {
		if bytes.Contains(raw, []byte(v)) {
			t.Errorf("ferry.db holds %q in clear", v)
		}
	}
	if !bytes.Contains(raw, []byte("llama-plain-model")) || !bytes.Contains(raw, []byte(sealedPrefix)) {
		t.Errorf("ferry.db: want MODEL in clear and sealed values")
	}
	checkReadsBack(t, s)
	fi, err := os.Stat(KeyPath(path))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v; want mode 600", fi, err)
	}
}

// TestMigratesPlainSecrets: a store written before values were sealed (no key, no meta table,
// secrets in clear) is sealed when it is opened, and reads back the same.
func TestMigratesPlainSecrets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	fillStore(t, s)
	// Make it an old store: tasks in clear, no key check, no key.
	for _, q := range []struct{ table, column string }{{"services", "task_json"}, {"versions", "task_json"}} {
		rows, err := s.db.Query(`SELECT rowid, ` + q.column + ` FROM ` + q.table)
		if err != nil {
			t.Fatal(err)
		}
		plain := map[int64]string{}
		for rows.Next() {
			var id int64
			var data string
			if err := rows.Scan(&id, &data); err != nil {
				t.Fatal(err)
			}
			var task configs.Task
			if err := json.Unmarshal([]byte(data), &task); err != nil {
				t.Fatal(err)
			}
			if err := s.seal.openTask(&task); err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(&task)
			plain[id] = string(b)
		}
		rows.Close()
		for id, data := range plain {
			if _, err := s.db.Exec(`UPDATE `+q.table+` SET `+q.column+` = ? WHERE rowid = ?`, data, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	js, err := s.ListJobs()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(js[0])
	if _, err := s.db.Exec(`UPDATE jobs SET job_json = ?`, string(b)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`DROP TABLE meta`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Remove(KeyPath(path)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(storeFiles(t, path), []byte(secretHF)) {
		t.Fatal("the old store should hold the secret in clear")
	}

	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatalf("open a store from before sealing: %v", err)
	}
	defer s.Close()
	checkReadsBack(t, s)
	if _, err := s.db.Exec(`VACUUM`); err != nil { // drop the old pages' leftovers
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	raw := storeFiles(t, path)
	for _, v := range []string{secretHF, secretAWS, secretJobKey, envPassword} {
		if bytes.Contains(raw, []byte(v)) {
			t.Errorf("after the migration ferry.db holds %q in clear", v)
		}
	}
}

// TestStoreKeyMissingOrWrong: a store opened without its key, or with another, is refused with
// ErrStoreKey and a message that names the key file and says what to do; no new key replaces
// a missing one, and nothing is lost: with the key back, the store opens.
func TestStoreKeyMissingOrWrong(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	fillStore(t, s)
	s.Close()
	keyPath := KeyPath(path)
	key, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}

	other := make([]byte, 32)
	_, _ = rand.Read(other)
	tests := map[string]struct {
		key      []byte // nil: no key file
		wantText string
	}{
		"missing":   {nil, "which is missing: restore that file"},
		"wrong":     {[]byte(base64.StdEncoding.EncodeToString(other)), "is not the key the store's secrets were sealed with"},
		"malformed": {[]byte("not a key"), "does not hold a key: want 32 bytes in base64"},
		"short":     {[]byte(base64.StdEncoding.EncodeToString(other[:16])), "does not hold a key"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			os.Remove(keyPath)
			if tt.key != nil {
				if err := os.WriteFile(keyPath, tt.key, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			s, err := OpenSQLite(path)
			if err == nil {
				s.Close()
				t.Fatal("opened with a missing or wrong key")
			}
			if !errors.Is(err, ErrStoreKey) || !strings.Contains(err.Error(), tt.wantText) || !strings.Contains(err.Error(), keyPath) {
				t.Errorf("error %q: want ErrStoreKey saying %q and naming %s", err, tt.wantText, keyPath)
			}
			if _, statErr := os.Stat(keyPath); tt.key == nil && statErr == nil {
				t.Error("a new key was made for a store sealed with another")
			}
		})
	}

	if err := os.WriteFile(keyPath, key, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatalf("with its key back: %v", err)
	}
	defer s.Close()
	checkReadsBack(t, s)
}

// TestStoreKeyFromEnv: FERRY_STORE_KEY_FILE names the key (say, a mounted Kubernetes Secret);
// none is made beside ferry.db, and a key file others can read is tightened.
func TestStoreKeyFromEnv(t *testing.T) {
	dir := t.TempDir()
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	keyFile := filepath.Join(dir, "mounted-key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(raw)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(KeyFileEnv, keyFile)
	path := filepath.Join(dir, "ferry.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	fillStore(t, s)
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "store.key")); err == nil {
		t.Error("store.key was made although FERRY_STORE_KEY_FILE names the key")
	}
	if fi, _ := os.Stat(keyFile); fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %o, want 600", fi.Mode().Perm())
	}
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkReadsBack(t, s)
}

// TestSealedValueBoundToName: a sealed value copied under another name does not open.
func TestSealedValueBoundToName(t *testing.T) {
	s, err := loadKey(filepath.Join(t.TempDir(), "k"), true)
	if err != nil {
		t.Fatal(err)
	}
	sealed := s.seal("secrets", "HF_TOKEN", secretHF)
	if got, err := s.open("secrets", "HF_TOKEN", sealed); err != nil || got != secretHF {
		t.Fatalf("open: %q, %v", got, err)
	}
	if _, err := s.open("secrets", "OTHER", sealed); !errors.Is(err, ErrStoreKey) {
		t.Errorf("a value moved to another name opened: %v", err)
	}
	if _, err := s.open("envs", "HF_TOKEN", sealed); !errors.Is(err, ErrStoreKey) {
		t.Errorf("a value moved to another field opened: %v", err)
	}
}

// BenchmarkSealTask is what sealing adds to a task's write and opening to its read: one task
// with two secrets and one credential-named env among two.
func BenchmarkSealTask(b *testing.B) {
	s, err := loadKey(filepath.Join(b.TempDir(), "k"), true)
	if err != nil {
		b.Fatal(err)
	}
	task := secretTask("serve")
	b.Run("seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.sealTask(task)
		}
	})
	sealed := s.sealTask(task)
	b.Run("open", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			t := *sealed
			t.Envs, t.Secrets = cloneMap(sealed.Envs), cloneMap(sealed.Secrets)
			if err := s.openTask(&t); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func cloneMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// BenchmarkGetServiceWithSecrets is a whole read of a service whose task has sealed values
// (serve status reads every service so), for scale against BenchmarkSealTask/open.
func BenchmarkGetServiceWithSecrets(b *testing.B) {
	s, err := OpenSQLite(filepath.Join(b.TempDir(), "ferry.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateService(Service{Name: "chat", Version: 1, Task: secretTask("serve"), Port: 1}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.GetService("chat"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConcurrentFirstOpensShareOneKey: handles opening a new store at once all end up with the
// one key that was made (none reads a partial key or replaces another's), and each reads what
// the others wrote.
func TestConcurrentFirstOpensShareOneKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	const n = 4
	stores := make(chan *SQLite, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			s, err := OpenSQLite(path)
			if err != nil {
				errs <- err
				return
			}
			stores <- s
		}()
	}
	var opened []*SQLite
	for range n {
		select {
		case err := <-errs:
			t.Errorf("concurrent first open: %v", err)
		case s := <-stores:
			opened = append(opened, s)
			defer s.Close()
		}
	}
	if len(opened) != n {
		t.Fatalf("%d of %d opened", len(opened), n)
	}
	fillStore(t, opened[0])
	for _, s := range opened[1:] {
		checkReadsBack(t, s)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".store.key-") {
			t.Errorf("temporary key file %s left behind", e.Name())
		}
	}
}

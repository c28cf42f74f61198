package store

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
)

// A task's secrets, and its envs named like a credential (configs.CredentialEnv), are kept in
// ferry.db sealed: AES-256-GCM under the store key, each value on its own with a fresh random
// nonce, and bound to its field and name (a sealed HF_TOKEN cannot be moved to another name).
// The rest of the row stays plain JSON that the sqlite3 shell can read. A sealed value is
// sealedPrefix followed by base64(nonce || ciphertext).
const sealedPrefix = "ferry-sealed:v1:"

// KeyFileEnv names a key file to use instead of the default, store.key beside ferry.db: in a
// pod, a Kubernetes Secret mounted as a file.
const KeyFileEnv = "FERRY_STORE_KEY_FILE"

// keyCheck is the meta row that proves, when the store opens, that the key is the one its
// values were sealed with: a wrong key is refused then, not at the first read of a secret.
const (
	metaKeyCheck  = "key_check"
	keyCheckPlain = "ferry store key check"
)

// ErrStoreKey is returned (wrapped) when the store key is missing, unreadable or not the one
// ferry.db's secrets were sealed with.
var ErrStoreKey = errors.New("store key")

// sealer seals and opens values under one key.
type sealer struct {
	aead cipher.AEAD
	path string // the key file, for error messages
}

// KeyPath is the key file for the store at dbPath: $FERRY_STORE_KEY_FILE when set, else
// store.key in the same directory.
func KeyPath(dbPath string) string {
	if p := os.Getenv(KeyFileEnv); p != "" {
		return p
	}
	return filepath.Join(filepath.Dir(dbPath), "store.key")
}

// loadKey reads the key file, or creates it (32 random bytes, base64, 0600) when it is missing
// and create is set. A key file others may read is tightened to 0600.
func loadKey(path string, create bool) (*sealer, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && create {
		data, err = createKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrStoreKey, path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o077 != 0 {
		_ = os.Chmod(path, 0o600) // a mounted Secret is read-only: its mode is the pod's to set
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("%w: %s does not hold a key: want 32 bytes in base64 (head -c 32 /dev/urandom | base64)", ErrStoreKey, path)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrStoreKey, path, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrStoreKey, path, err)
	}
	return &sealer{aead: aead, path: path}, nil
}

// createKey writes a new key to path, unless another process did first: then it reads that
// one. The key is written to a temporary file and linked into place, so no reader ever sees a
// partial key, and link(2) fails rather than replace a key that exists.
func createKey(path string) ([]byte, error) {
	raw := make([]byte, 32)
	_, _ = rand.Read(raw) // it never returns an error (Go 1.24)
	data := []byte(base64.StdEncoding.EncodeToString(raw) + "\n")
	tmp, err := os.CreateTemp(filepath.Dir(path), ".store.key-*") // mode 0600
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return os.ReadFile(path)
	} else if err != nil {
		return nil, err
	}
	return data, nil
}

// seal encrypts value, bound to field and name.
func (s *sealer) seal(field, name, value string) string {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(value)+s.aead.Overhead())
	_, _ = rand.Read(nonce) // it never returns an error (Go 1.24)
	out := s.aead.Seal(nonce, nonce, []byte(value), []byte(field+"\x00"+name))
	return sealedPrefix + base64.StdEncoding.EncodeToString(out)
}

// open decrypts a value seal made; a value without sealedPrefix is returned as it is.
func (s *sealer) open(field, name, value string) (string, error) {
	b64, ok := strings.CutPrefix(value, sealedPrefix)
	if !ok {
		return value, nil
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) < s.aead.NonceSize() {
		return "", fmt.Errorf("%w: %s %s in the store is damaged", ErrStoreKey, field, name)
	}
	plain, err := s.aead.Open(nil, raw[:s.aead.NonceSize()], raw[s.aead.NonceSize():], []byte(field+"\x00"+name))
	if err != nil {
		return "", fmt.Errorf("%w: %s %s cannot be decrypted with the key in %s: it is not the key the store was written with (restore that key file)", ErrStoreKey, field, name, s.path)
	}
	return string(plain), nil
}

// sealTask returns a shallow copy of t whose secrets, credential-named envs and any env that
// looks sealed already (so that reading it back gives what was written) are sealed. t is not
// changed.
func (s *sealer) sealTask(t *configs.Task) *configs.Task {
	if t == nil || (len(t.Secrets) == 0 && len(t.Envs) == 0) {
		return t
	}
	out := *t
	if t.Secrets != nil {
		out.Secrets = make(map[string]string, len(t.Secrets))
		for k, v := range t.Secrets {
			out.Secrets[k] = s.seal("secrets", k, v)
		}
	}
	if t.Envs != nil {
		out.Envs = maps.Clone(t.Envs)
		for k, v := range t.Envs {
			if configs.CredentialEnv(k) || strings.HasPrefix(v, sealedPrefix) {
				out.Envs[k] = s.seal("envs", k, v)
			}
		}
	}
	return &out
}

// openTask decrypts, in place, every sealed value of t's secrets and envs.
func (s *sealer) openTask(t *configs.Task) error {
	if t == nil {
		return nil
	}
	for field, m := range map[string]map[string]string{"secrets": t.Secrets, "envs": t.Envs} {
		for k, v := range m {
			plain, err := s.open(field, k, v)
			if err != nil {
				return err
			}
			m[k] = plain
		}
	}
	return nil
}

// setupKey loads the store's key and makes sure it is the one its values are sealed with. A
// store that has no key check yet (new, or from before values were sealed) gets one, with
// every task it holds sealed, in one transaction: a crash leaves it as it was.
func setupKey(db *sql.DB, keyPath string) (*sealer, error) {
	var check string
	err := db.QueryRow(`SELECT value FROM meta WHERE key = ?`, metaKeyCheck).Scan(&check)
	switch {
	case err == nil:
		return verifyKey(keyPath, check)
	case !errors.Is(err, sql.ErrNoRows):
		return nil, err
	}
	s, err := loadKey(keyPath, true)
	if err != nil {
		return nil, err
	}
	sealed := s
	err = inTx(db, func(tx *sql.Tx) error {
		// Another handle may have sealed the store since the read above; BEGIN IMMEDIATE
		// holds the write lock now.
		if err := tx.QueryRow(`SELECT value FROM meta WHERE key = ?`, metaKeyCheck).Scan(&check); err == nil {
			sealed, err = verifyKey(keyPath, check)
			return err
		}
		if err := sealRows(tx, s); err != nil {
			return fmt.Errorf("seal the secrets the store holds: %w", err)
		}
		_, err := tx.Exec(`INSERT INTO meta (key, value) VALUES (?, ?)`, metaKeyCheck, s.seal("meta", metaKeyCheck, keyCheckPlain))
		return err
	})
	if err != nil {
		return nil, err
	}
	return sealed, nil
}

// verifyKey loads the key file, which must exist, and checks it against the stored check.
func verifyKey(keyPath, check string) (*sealer, error) {
	s, err := loadKey(keyPath, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: the store's secrets are sealed with the key in %s, which is missing: restore that file (or point %s at it); a new key cannot read them", ErrStoreKey, keyPath, KeyFileEnv)
	}
	if err != nil {
		return nil, err
	}
	if got, err := s.open("meta", metaKeyCheck, check); err != nil || got != keyCheckPlain {
		return nil, fmt.Errorf("%w: %s is not the key the store's secrets were sealed with: restore that key file (or point %s at it)", ErrStoreKey, keyPath, KeyFileEnv)
	}
	return s, nil
}

// sealRows seals the tasks of every service, version and job row: the migration of a store
// written before values were sealed, whose values are all plain.
func sealRows(tx *sql.Tx, s *sealer) error {
	for _, table := range []string{"services", "versions"} {
		if err := sealColumn(tx, table, "task_json", func(data []byte) (any, error) {
			var t configs.Task
			if err := json.Unmarshal(data, &t); err != nil {
				return nil, err
			}
			return s.sealTask(&t), nil
		}); err != nil {
			return err
		}
	}
	return sealColumn(tx, "jobs", "job_json", func(data []byte) (any, error) {
		var j jobs.Job
		if err := json.Unmarshal(data, &j); err != nil {
			return nil, err
		}
		j.Task = s.sealTask(j.Task)
		return j, nil
	})
}

// sealColumn rewrites column of every row of table with what seal makes of it.
func sealColumn(tx *sql.Tx, table, column string, seal func([]byte) (any, error)) error {
	rows, err := tx.Query(fmt.Sprintf(`SELECT rowid, %s FROM %s`, column, table))
	if err != nil {
		return err
	}
	type row struct {
		id   int64
		data string
	}
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.data); err != nil {
			rows.Close()
			return err
		}
		all = append(all, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, r := range all {
		v, err := seal([]byte(r.data))
		if err != nil {
			return fmt.Errorf("%s row %d: %w", table, r.id, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(fmt.Sprintf(`UPDATE %s SET %s = ? WHERE rowid = ?`, table, column), string(b), r.id); err != nil {
			return err
		}
	}
	return nil
}

// Package store is the controller's state in embedded SQLite (pure Go, modernc.org/sqlite). The
// schema is plain so that an operator can read it with the sqlite3 shell: one row per service,
// one row per replica.
package store

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/replicas"

	sqlite "modernc.org/sqlite" // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrNotFound is returned when a service does not exist.
var ErrNotFound = errors.New("not found")

// SQLite is the embedded Store, safe for concurrent use (database/sql serialises through one
// connection).
type SQLite struct {
	db *sql.DB
	// seal seals the tasks' secrets and credential-named envs (seal.go).
	seal *sealer
}

// Service is one service row.
type Service struct {
	Name    string
	Version int
	// Task holds secrets: the store file is 0600, the secrets in it are sealed (seal.go), and
	// the task is never logged.
	Task *configs.Task
	// Port is the proxy listener's port, kept so that the endpoint survives controller restarts.
	Port   int
	Status string
	// Target is the replica count last decided (-1 before any), so that a restarted controller
	// resumes from it rather than from whatever replicas it counts mid-rollout.
	Target    int
	CreatedAt time.Time
	UpdatedAt time.Time
}

const schema = `
CREATE TABLE IF NOT EXISTS services (
	name            TEXT PRIMARY KEY,
	version         INTEGER NOT NULL,
	task_json       TEXT NOT NULL,
	port            INTEGER NOT NULL,
	status          TEXT NOT NULL,
	next_replica_id INTEGER NOT NULL DEFAULT 1,
	created_at      INTEGER NOT NULL,
	updated_at      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS replicas (
	service     TEXT NOT NULL,
	id          INTEGER NOT NULL,
	version     INTEGER NOT NULL,
	status      TEXT NOT NULL,
	instance_id TEXT NOT NULL DEFAULT '',
	endpoint    TEXT NOT NULL DEFAULT '',
	infra       TEXT NOT NULL DEFAULT '',
	zone        TEXT NOT NULL DEFAULT '',
	spot        INTEGER NOT NULL DEFAULT 0,
	price       REAL NOT NULL DEFAULT 0,
	resources   TEXT NOT NULL DEFAULT '',
	launched_at INTEGER NOT NULL DEFAULT 0,
	ready_at    INTEGER NOT NULL DEFAULT 0,
	reason      TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (service, id)
);
CREATE TABLE IF NOT EXISTS versions (
	service     TEXT NOT NULL,
	version     INTEGER NOT NULL,
	task_json   TEXT NOT NULL,
	launched_as INTEGER NOT NULL,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (service, version)
);
CREATE TABLE IF NOT EXISTS jobs (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	name       TEXT NOT NULL,
	state      TEXT NOT NULL,
	job_json   TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rollouts (
	service      TEXT PRIMARY KEY,
	rollout_json TEXT NOT NULL,
	updated_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS leftovers (
	key             TEXT PRIMARY KEY,
	infra           TEXT NOT NULL,
	instance_id     TEXT NOT NULL DEFAULT '',
	selector_json   TEXT NOT NULL DEFAULT '',
	launched_before TEXT NOT NULL DEFAULT '',
	owner           TEXT NOT NULL DEFAULT '',
	reason          TEXT NOT NULL DEFAULT '',
	since           TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS tenants (
	id             INTEGER PRIMARY KEY CHECK (id = 1),
	version        INTEGER NOT NULL,
	directory_json TEXT NOT NULL,
	updated_at     INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS usage (
	day           TEXT NOT NULL,
	key_id        TEXT NOT NULL,
	service       TEXT NOT NULL,
	model         TEXT NOT NULL,
	team          TEXT NOT NULL DEFAULT '',
	requests      INTEGER NOT NULL DEFAULT 0,
	errors        INTEGER NOT NULL DEFAULT 0,
	input_tokens  INTEGER NOT NULL DEFAULT 0,
	output_tokens INTEGER NOT NULL DEFAULT 0,
	cost_micros   INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (day, key_id, service, model)
);
`

// migrations add columns that later versions need to a store made by an earlier one. A table
// added later needs none: its CREATE TABLE IF NOT EXISTS in schema runs on every open.
var migrations = []struct{ table, column, decl string }{
	{"services", "target", "INTEGER NOT NULL DEFAULT -1"},
	{"services", "spot_losses_json", "TEXT NOT NULL DEFAULT ''"},
}

// OpenSQLite opens (creating if needed) the database at path with owner-only permissions, and
// its key (KeyPath: store.key beside it unless FERRY_STORE_KEY_FILE names another; created on
// first use). A store whose key is missing or wrong is refused with ErrStoreKey.
func OpenSQLite(path string) (*SQLite, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	f.Close()
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	// WAL keeps readers (status) from blocking the writer; busy_timeout rides out the rare
	// overlap with an exiting controller during a restart. Transactions begin IMMEDIATE: they
	// take the write lock at BEGIN, waiting for it under busy_timeout, so that one that reads
	// before it writes can never fail to upgrade (SQLITE_BUSY, which no timeout retries) when
	// another handle on the file wrote meanwhile: SQLite's equivalent of a conflict.
	dsn := "file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(ON)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	db.SetMaxOpenConns(1)
	if err := connect(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("create schema in %s: %w", path, err)
	}
	seal, err := setupKey(db, KeyPath(path))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return &SQLite{db: db, seal: seal}, nil
}

// connect opens the first connection, waiting out the other handles that are opening a new
// store at the same moment: switching a new file to WAL takes an exclusive lock, and SQLite
// reports SQLITE_BUSY for it at once rather than through busy_timeout.
func connect(db *sql.DB) error {
	deadline := time.Now().Add(5 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		err := db.Ping()
		var e *sqlite.Error
		if err == nil || !errors.As(err, &e) || e.Code()&0xff != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
	}
}

// migrate creates the schema and adds missing columns in one transaction, which begins
// IMMEDIATE (see the DSN): handles opening a new or old store at once take turns under
// busy_timeout, and the second finds the tables and columns the first made instead of racing it
// ("database is locked" on an autocommit CREATE, "duplicate column name" on ALTER).
func migrate(db *sql.DB) error {
	return inTx(db, func(tx *sql.Tx) error {
		if _, err := tx.Exec(schema); err != nil {
			return err
		}
		for _, m := range migrations {
			var n int
			if err := tx.QueryRow(`SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?`, m.table, m.column).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				if _, err := tx.Exec(fmt.Sprintf(`ALTER TABLE %s ADD COLUMN %s %s`, m.table, m.column, m.decl)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// inTx runs fn in one transaction (IMMEDIATE: see OpenSQLite) and commits it if fn returns
// nil; otherwise it rolls back.
func inTx(db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQLite) inTx(fn func(*sql.Tx) error) error { return inTx(s.db, fn) }

// Close closes the database.
func (s *SQLite) Close() error { return s.db.Close() }

// CreateService inserts a new service; it fails if the name exists.
func (s *SQLite) CreateService(svc Service) error {
	task, err := json.Marshal(s.seal.sealTask(svc.Task))
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	return s.inTx(func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO services (name, version, task_json, port, status, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, svc.Name, svc.Version, string(task), svc.Port, svc.Status, now, now)
		if err != nil {
			return fmt.Errorf("create service %q: %w", svc.Name, err)
		}
		// A failed serve up leaves rows of a service of the same name behind only if deleting it
		// failed too; start its history afresh.
		for _, q := range []string{`DELETE FROM versions WHERE service = ?`, `DELETE FROM rollouts WHERE service = ?`} {
			if _, err := tx.Exec(q, svc.Name); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(`INSERT INTO versions (service, version, task_json, launched_as, created_at) VALUES (?, ?, ?, ?, ?)`,
			svc.Name, svc.Version, string(task), svc.Version, now); err != nil {
			return fmt.Errorf("create service %q: %w", svc.Name, err)
		}
		return nil
	})
}

// SetTarget records a service's replica target.
func (s *SQLite) SetTarget(name string, n int) error {
	_, err := s.db.Exec(`UPDATE services SET target = ? WHERE name = ?`, n, name)
	return err
}

// StartUpdate records a new version and the rollout to it in one transaction: a controller
// killed right after still finds both.
func (s *SQLite) StartUpdate(service string, v replicas.Version, r replicas.Rollout) error {
	task, err := json.Marshal(s.seal.sealTask(v.Task))
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	return s.inTx(func(tx *sql.Tx) error {
		// A store from before versions were kept has the current task only on the service row.
		if _, err := tx.Exec(`INSERT OR IGNORE INTO versions (service, version, task_json, launched_as, created_at)
			SELECT name, version, task_json, version, created_at FROM services WHERE name = ?`, service); err != nil {
			return err
		}
		if _, err := tx.Exec(`INSERT INTO versions (service, version, task_json, launched_as, created_at) VALUES (?, ?, ?, ?, ?)`,
			service, v.Number, string(task), v.LaunchedAs, now); err != nil {
			return fmt.Errorf("record version %d of %q: %w", v.Number, service, err)
		}
		if err := saveRollout(tx, service, r, now); err != nil {
			return err
		}
		return nil
	})
}

// SaveRollout implements replicas.RolloutStore: it saves the rollout and makes its target the
// service's current version.
func (s *SQLite) SaveRollout(service string, r replicas.Rollout) error {
	return s.inTx(func(tx *sql.Tx) error {
		if err := saveRollout(tx, service, r, time.Now().UnixMilli()); err != nil {
			return err
		}
		return nil
	})
}

func saveRollout(tx *sql.Tx, service string, r replicas.Rollout, now int64) error {
	r.NewHealthy, r.NewReady, r.OldLive, r.Desired = 0, 0, 0, 0 // live counts are not state
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(`INSERT INTO rollouts (service, rollout_json, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (service) DO UPDATE SET rollout_json = excluded.rollout_json, updated_at = excluded.updated_at`,
		service, string(b), now); err != nil {
		return fmt.Errorf("save rollout of %q: %w", service, err)
	}
	res, err := tx.Exec(`UPDATE services SET version = ?, updated_at = ?,
		task_json = (SELECT task_json FROM versions WHERE service = ? AND version = ?)
		WHERE name = ? AND EXISTS (SELECT 1 FROM versions WHERE service = ? AND version = ?)`,
		r.Target(), now, service, r.Target(), service, service, r.Target())
	if err != nil {
		return fmt.Errorf("save rollout of %q: %w", service, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("save rollout of %q: version %d: %w", service, r.Target(), ErrNotFound)
	}
	return nil
}

// Versions returns the service's recorded versions, oldest first.
func (s *SQLite) Versions(service string) ([]replicas.Version, error) {
	rows, err := s.db.Query(`SELECT version, task_json, launched_as FROM versions WHERE service = ? ORDER BY version`, service)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []replicas.Version
	for rows.Next() {
		var (
			v        replicas.Version
			taskJSON string
		)
		if err := rows.Scan(&v.Number, &taskJSON, &v.LaunchedAs); err != nil {
			return nil, err
		}
		v.Task = new(configs.Task)
		if err := json.Unmarshal([]byte(taskJSON), v.Task); err != nil {
			return nil, fmt.Errorf("version %d of %q: decode task: %w", v.Number, service, err)
		}
		if err := s.seal.openTask(v.Task); err != nil {
			return nil, fmt.Errorf("version %d of %q: %w", v.Number, service, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Rollout returns the service's latest rollout, or nil if it never had one.
func (s *SQLite) Rollout(service string) (*replicas.Rollout, error) {
	var b string
	err := s.db.QueryRow(`SELECT rollout_json FROM rollouts WHERE service = ?`, service).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r replicas.Rollout
	if err := json.Unmarshal([]byte(b), &r); err != nil {
		return nil, fmt.Errorf("rollout of %q: %w", service, err)
	}
	return &r, nil
}

// SetServiceStatus records a service's status.
func (s *SQLite) SetServiceStatus(name, status string) error {
	res, err := s.db.Exec(`UPDATE services SET status = ?, updated_at = ? WHERE name = ?`,
		status, time.Now().UnixMilli(), name)
	if err != nil {
		return fmt.Errorf("set status of %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	return nil
}

// GetService returns one service.
func (s *SQLite) GetService(name string) (Service, error) {
	row := s.db.QueryRow(`SELECT name, version, task_json, port, status, target, created_at, updated_at
		FROM services WHERE name = ?`, name)
	svc, err := s.scanService(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Service{}, fmt.Errorf("service %q: %w", name, ErrNotFound)
	}
	return svc, err
}

// ListServices returns every service ordered by name.
func (s *SQLite) ListServices() ([]Service, error) {
	rows, err := s.db.Query(`SELECT name, version, task_json, port, status, target, created_at, updated_at
		FROM services ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Service
	for rows.Next() {
		svc, err := s.scanService(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, svc)
	}
	return out, rows.Err()
}

// DeleteService removes a service and its replica rows.
func (s *SQLite) DeleteService(name string) error {
	return s.inTx(func(tx *sql.Tx) error {
		for _, q := range []string{`DELETE FROM replicas WHERE service = ?`, `DELETE FROM versions WHERE service = ?`,
			`DELETE FROM rollouts WHERE service = ?`} {
			if _, err := tx.Exec(q, name); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(`DELETE FROM services WHERE name = ?`, name); err != nil {
			return err
		}
		return nil
	})
}

type scanner interface{ Scan(dest ...any) error }

func (s *SQLite) scanService(row scanner) (Service, error) {
	var (
		svc              Service
		taskJSON         string
		created, updated int64
	)
	if err := row.Scan(&svc.Name, &svc.Version, &taskJSON, &svc.Port, &svc.Status, &svc.Target, &created, &updated); err != nil {
		return Service{}, err
	}
	svc.Task = new(configs.Task)
	if err := json.Unmarshal([]byte(taskJSON), svc.Task); err != nil {
		return Service{}, fmt.Errorf("service %q: decode task: %w", svc.Name, err)
	}
	if err := s.seal.openTask(svc.Task); err != nil {
		return Service{}, fmt.Errorf("service %q: %w", svc.Name, err)
	}
	svc.CreatedAt = time.UnixMilli(created)
	svc.UpdatedAt = time.UnixMilli(updated)
	return svc, nil
}

// SaveLosses implements replicas.LossStore. A service that is gone has no losses to keep.
func (s *SQLite) SaveLosses(service string, l replicas.Losses) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if _, err := s.db.Exec(`UPDATE services SET spot_losses_json = ? WHERE name = ?`, string(b), service); err != nil {
		return fmt.Errorf("save spot losses of %q: %w", service, err)
	}
	return nil
}

// Losses implements replicas.LossStore: the zero value for a service that saved none.
func (s *SQLite) Losses(service string) (replicas.Losses, error) {
	var (
		l replicas.Losses
		b string
	)
	err := s.db.QueryRow(`SELECT spot_losses_json FROM services WHERE name = ?`, service).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && b == "") {
		return l, nil
	}
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal([]byte(b), &l); err != nil {
		return l, fmt.Errorf("spot losses of %q: %w", service, err)
	}
	return l, nil
}

var (
	_ replicas.Store        = (*SQLite)(nil)
	_ replicas.RolloutStore = (*SQLite)(nil)
	_ replicas.LossStore    = (*SQLite)(nil)
)

// NextReplicaIDs hands out replica ids that are never reused within a service, as SkyServe
// does, so that logs and status lines about an old replica never get confused with a new one.
func (s *SQLite) NextReplicaIDs(service string, n int) (int, error) {
	if n < 1 {
		return 0, fmt.Errorf("next replica ids of %q: asked for %d", service, n)
	}
	var id int
	err := s.db.QueryRow(`UPDATE services SET next_replica_id = next_replica_id + ?
		WHERE name = ? RETURNING next_replica_id - ?`, n, service, n).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("service %q: %w", service, ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("next replica id of %q: %w", service, err)
	}
	return id, nil
}

// SaveReplica inserts or updates a replica row. It also moves the service's id counter past
// the id, so an instance adopted from a label can never collide with a later replica. The
// service must exist: a status write that comes after DeleteService (a replica's last
// transition, racing the delete) fails with ErrNotFound and leaves no row behind.
func (s *SQLite) SaveReplica(r replicas.Record) error {
	return s.inTx(func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO replicas (service, id, version, status, instance_id, endpoint, infra, zone,
				spot, price, resources, launched_at, ready_at, reason)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (service, id) DO UPDATE SET version = excluded.version, status = excluded.status,
				instance_id = excluded.instance_id, endpoint = excluded.endpoint, infra = excluded.infra,
				zone = excluded.zone, spot = excluded.spot, price = excluded.price,
				resources = excluded.resources, launched_at = excluded.launched_at,
				ready_at = excluded.ready_at, reason = excluded.reason`,
			r.Service, r.ID, r.Version, string(r.Status), r.InstanceID, r.Endpoint, r.Infra, r.Zone,
			r.Spot, r.Price, r.Resources, millis(r.LaunchedAt), millis(r.ReadyAt), r.Reason)
		if err != nil {
			return fmt.Errorf("save replica %s/%d: %w", r.Service, r.ID, err)
		}
		res, err := tx.Exec(`UPDATE services SET next_replica_id = MAX(next_replica_id, ? + 1) WHERE name = ?`, r.ID, r.Service)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("save replica %s/%d: service %q: %w", r.Service, r.ID, r.Service, ErrNotFound)
		}
		return nil
	})
}

// DeleteReplica forgets a replica.
func (s *SQLite) DeleteReplica(service string, id int) error {
	_, err := s.db.Exec(`DELETE FROM replicas WHERE service = ? AND id = ?`, service, id)
	return err
}

// ListReplicas returns a service's replica rows ordered by id.
func (s *SQLite) ListReplicas(service string) ([]replicas.Record, error) {
	rows, err := s.db.Query(`SELECT service, id, version, status, instance_id, endpoint, infra, zone,
			spot, price, resources, launched_at, ready_at, reason
		FROM replicas WHERE service = ? ORDER BY id`, service)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []replicas.Record
	for rows.Next() {
		var (
			r                 replicas.Record
			status            string
			launched, readyAt int64
		)
		if err := rows.Scan(&r.Service, &r.ID, &r.Version, &status, &r.InstanceID, &r.Endpoint, &r.Infra,
			&r.Zone, &r.Spot, &r.Price, &r.Resources, &launched, &readyAt, &r.Reason); err != nil {
			return nil, err
		}
		r.Status = replicas.Status(status)
		r.LaunchedAt = fromMillis(launched)
		r.ReadyAt = fromMillis(readyAt)
		out = append(out, r)
	}
	return out, rows.Err()
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMillis(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// CreateJob implements jobs.Store: the row's id is the job's (AUTOINCREMENT: never reused,
// even after the newest job is deleted).
func (s *SQLite) CreateJob(j jobs.Job) (int64, error) {
	j.Task = s.seal.sealTask(j.Task)
	data, err := json.Marshal(j)
	if err != nil {
		return 0, err
	}
	now := millis(time.Now())
	res, err := s.db.Exec(`INSERT INTO jobs (name, state, job_json, created_at, updated_at) VALUES (?, ?, ?, ?, ?)`,
		j.Name, string(j.State), string(data), now, now)
	if err != nil {
		return 0, fmt.Errorf("create job: %w", err)
	}
	return res.LastInsertId()
}

// SaveJob implements jobs.Store.
func (s *SQLite) SaveJob(j jobs.Job) error {
	j.Task = s.seal.sealTask(j.Task)
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	res, err := s.db.Exec(`UPDATE jobs SET name = ?, state = ?, job_json = ?, updated_at = ? WHERE id = ?`,
		j.Name, string(j.State), string(data), millis(time.Now()), j.ID)
	if err != nil {
		return fmt.Errorf("save job %d: %w", j.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("save job %d: %w", j.ID, ErrNotFound)
	}
	return nil
}

// ListJobs implements jobs.Store, oldest first.
func (s *SQLite) ListJobs() ([]jobs.Job, error) {
	rows, err := s.db.Query(`SELECT id, job_json FROM jobs ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	defer rows.Close()
	var out []jobs.Job
	for rows.Next() {
		var id int64
		var data string
		if err := rows.Scan(&id, &data); err != nil {
			return nil, err
		}
		var j jobs.Job
		if err := json.Unmarshal([]byte(data), &j); err != nil {
			return nil, fmt.Errorf("job %d: %w", id, err)
		}
		if err := s.seal.openTask(j.Task); err != nil {
			return nil, fmt.Errorf("job %d: %w", id, err)
		}
		j.ID = id
		out = append(out, j)
	}
	return out, rows.Err()
}

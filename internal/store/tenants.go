package store

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferryserve/ferry/tenants"
)

// TenantStore keeps who may call the endpoints and what they used (package tenants): the
// directory of keys, teams and prices as one versioned document, and the usage rows the
// controller's hub gathers from every proxy. The directory holds key hashes, never secrets.
type TenantStore interface {
	// Tenants returns the directory; an empty one at Version 0 when none was ever put.
	Tenants() (tenants.Directory, error)
	// PutTenants replaces the directory with d, only if the stored one is at d.Version-1: a
	// writer that read an older version gets ErrTenantsChanged (wrapped) and must read again.
	PutTenants(d tenants.Directory) error
	// AddUsage adds rows to what is stored: rows with the same Row.ID add their counts (a
	// stored row keeps its team). On a backend that writes rows in several objects, a failure
	// part-way is an *UnsavedUsageError naming the rows not written.
	AddUsage(rows []tenants.Row) error
	// Usage returns the rows of day since and after, ordered by day, key, service and model.
	Usage(since tenants.Day) ([]tenants.Row, error)
}

// ErrTenantsChanged refuses a PutTenants whose version does not follow the stored one.
var ErrTenantsChanged = errors.New("the tenants directory changed meanwhile")

// UnsavedUsageError is an AddUsage that wrote some rows and not others: the caller keeps Rows
// (and only them) to add again, so that nothing is counted twice.
type UnsavedUsageError struct {
	Rows []tenants.Row
	Err  error
}

func (e *UnsavedUsageError) Error() string {
	return fmt.Sprintf("%d usage rows not saved: %v", len(e.Rows), e.Err)
}

func (e *UnsavedUsageError) Unwrap() error { return e.Err }

// staleTenants is the error of a put at version want over a stored directory at have.
func staleTenants(want, have int64) error {
	return fmt.Errorf("put tenants version %d over stored version %d: %w", want, have, ErrTenantsChanged)
}

// CheckTenantsVersion is PutTenants' rule for every backend: d must follow the stored version.
func CheckTenantsVersion(d tenants.Directory, stored int64) error {
	if d.Version != stored+1 {
		return staleTenants(d.Version, stored)
	}
	return nil
}

// The SQLite schema keeps the directory as one JSON document in a one-row table (it is read and
// replaced whole, and handed to proxies whole) and the usage as plain rows an operator can
// query: day as YYYY-MM-DD text, which sorts as the days do.

var _ TenantStore = (*SQLite)(nil)

// Tenants implements TenantStore.
func (s *SQLite) Tenants() (tenants.Directory, error) {
	var b string
	err := s.db.QueryRow(`SELECT directory_json FROM tenants WHERE id = 1`).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return tenants.Directory{}, nil
	}
	if err != nil {
		return tenants.Directory{}, fmt.Errorf("read tenants: %w", err)
	}
	var d tenants.Directory
	if err := json.Unmarshal([]byte(b), &d); err != nil {
		return tenants.Directory{}, fmt.Errorf("read tenants: %w", err)
	}
	return d, nil
}

// PutTenants implements TenantStore.
func (s *SQLite) PutTenants(d tenants.Directory) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return s.inTx(func(tx *sql.Tx) error {
		var stored int64
		err := tx.QueryRow(`SELECT version FROM tenants WHERE id = 1`).Scan(&stored)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("put tenants: %w", err)
		}
		if err := CheckTenantsVersion(d, stored); err != nil {
			return err
		}
		if _, err := tx.Exec(`INSERT INTO tenants (id, version, directory_json, updated_at) VALUES (1, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET version = excluded.version, directory_json = excluded.directory_json,
				updated_at = excluded.updated_at`, d.Version, string(b), time.Now().UnixMilli()); err != nil {
			return fmt.Errorf("put tenants: %w", err)
		}
		return nil
	})
}

// AddUsage implements TenantStore, in one transaction: all rows or none.
func (s *SQLite) AddUsage(rows []tenants.Row) error {
	if len(rows) == 0 {
		return nil
	}
	return s.inTx(func(tx *sql.Tx) error {
		for _, r := range rows {
			_, err := tx.Exec(`INSERT INTO usage (day, key_id, service, model, team, requests, errors, input_tokens, output_tokens, cost_micros)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT (day, key_id, service, model) DO UPDATE SET
					team = CASE WHEN usage.team = '' THEN excluded.team ELSE usage.team END,
					requests = usage.requests + excluded.requests, errors = usage.errors + excluded.errors,
					input_tokens = usage.input_tokens + excluded.input_tokens,
					output_tokens = usage.output_tokens + excluded.output_tokens,
					cost_micros = usage.cost_micros + excluded.cost_micros`,
				r.Day.String(), r.KeyID, r.Service, r.Model, r.Team, r.Requests, r.Errors, r.Input, r.Output, r.CostMicros)
			if err != nil {
				return fmt.Errorf("add usage: %w", err)
			}
		}
		return nil
	})
}

// Usage implements TenantStore.
func (s *SQLite) Usage(since tenants.Day) ([]tenants.Row, error) {
	rows, err := s.db.Query(`SELECT day, key_id, service, model, team, requests, errors, input_tokens, output_tokens, cost_micros
		FROM usage WHERE day >= ? ORDER BY day, key_id, service, model`, since.String())
	if err != nil {
		return nil, fmt.Errorf("read usage: %w", err)
	}
	defer rows.Close()
	var out []tenants.Row
	for rows.Next() {
		var (
			r   tenants.Row
			day string
		)
		if err := rows.Scan(&day, &r.KeyID, &r.Service, &r.Model, &r.Team, &r.Requests, &r.Errors, &r.Input, &r.Output, &r.CostMicros); err != nil {
			return nil, err
		}
		if err := r.Day.UnmarshalText([]byte(day)); err != nil {
			return nil, fmt.Errorf("usage row of %s: day %q: %w", r.KeyID, day, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

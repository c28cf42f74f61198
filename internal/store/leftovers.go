package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// The leftovers table keeps one row per launcher.Leftover, in plain columns an operator can
// read: the selector as a JSON object, the times as RFC 3339 text in UTC. Times keep their
// nanoseconds (the other tables' milliseconds would not do): launched_before is a cut-off the
// janitor compares launch times with, and the selector's key spells it to the nanosecond.

var _ launcher.Ledger = (*SQLite)(nil)

// errNoKey refuses a leftover without a key: it could never be forgotten by key.
var errNoKey = errors.New("leftover without a key")

// PutLeftover implements launcher.Ledger: it records l under l.Key, replacing what was there.
func (s *SQLite) PutLeftover(l launcher.Leftover) error {
	if l.Key == "" {
		return fmt.Errorf("put leftover %s: %w", l.Describe(), errNoKey)
	}
	var selector string
	if len(l.Selector) > 0 {
		b, err := json.Marshal(l.Selector)
		if err != nil {
			return err
		}
		selector = string(b)
	}
	_, err := s.db.Exec(`INSERT INTO leftovers (key, infra, instance_id, selector_json, launched_before, owner, reason, since)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (key) DO UPDATE SET infra = excluded.infra, instance_id = excluded.instance_id,
			selector_json = excluded.selector_json, launched_before = excluded.launched_before,
			owner = excluded.owner, reason = excluded.reason, since = excluded.since`,
		l.Key, l.Infra, l.InstanceID, selector, timeText(l.Before), l.Owner, l.Reason, timeText(l.Since))
	if err != nil {
		return fmt.Errorf("put leftover %q: %w", l.Key, err)
	}
	return nil
}

// DeleteLeftover implements launcher.Ledger; an unknown key is not an error.
func (s *SQLite) DeleteLeftover(key string) error {
	if _, err := s.db.Exec(`DELETE FROM leftovers WHERE key = ?`, key); err != nil {
		return fmt.Errorf("delete leftover %q: %w", key, err)
	}
	return nil
}

// ListLeftovers implements launcher.Ledger, ordered by key (byte order, as Go compares strings).
func (s *SQLite) ListLeftovers() ([]launcher.Leftover, error) {
	rows, err := s.db.Query(`SELECT key, infra, instance_id, selector_json, launched_before, owner, reason, since
		FROM leftovers ORDER BY key`)
	if err != nil {
		return nil, fmt.Errorf("list leftovers: %w", err)
	}
	defer rows.Close()
	var out []launcher.Leftover
	for rows.Next() {
		var (
			l                       launcher.Leftover
			selector, before, since string
		)
		if err := rows.Scan(&l.Key, &l.Infra, &l.InstanceID, &selector, &before, &l.Owner, &l.Reason, &since); err != nil {
			return nil, err
		}
		if selector != "" {
			if err := json.Unmarshal([]byte(selector), &l.Selector); err != nil {
				return nil, fmt.Errorf("leftover %q: selector: %w", l.Key, err)
			}
		}
		if l.Before, err = parseTimeText(before); err != nil {
			return nil, fmt.Errorf("leftover %q: launched_before: %w", l.Key, err)
		}
		if l.Since, err = parseTimeText(since); err != nil {
			return nil, fmt.Errorf("leftover %q: since: %w", l.Key, err)
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// timeText is t as RFC 3339 in UTC with its nanoseconds, "" for the zero time.
func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func parseTimeText(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

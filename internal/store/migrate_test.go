package store

import (
	"path/filepath"
	"testing"
)

func TestMigratesStoreWithoutTargetColumn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`ALTER TABLE services DROP COLUMN target`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatalf("open a store from before the target column: %v", err)
	}
	defer s.Close()
	if err := s.SetTarget("x", 1); err != nil {
		t.Fatal(err)
	}
}

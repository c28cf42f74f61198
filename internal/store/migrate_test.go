package store

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
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

// TestMigratesStoreWithoutLeftovers: a store from before the leftovers table gets it on open,
// and keeps what it had.
func TestMigratesStoreWithoutLeftovers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateService(Service{Name: "chat", Version: 1, Task: &configs.Task{Run: "x"}, Port: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`DROP TABLE leftovers`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatalf("open a store from before the leftovers table: %v", err)
	}
	defer s.Close()
	l := launcher.Leftover{Key: "i-1", Infra: "aws", InstanceID: "i-1", Since: time.Now()}
	if err := s.PutLeftover(l); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListLeftovers()
	if err != nil || len(got) != 1 || got[0].Key != "i-1" {
		t.Errorf("leftovers after the upgrade: %+v, %v; want i-1", got, err)
	}
	if _, err := s.GetService("chat"); err != nil {
		t.Errorf("the service from before the upgrade: %v", err)
	}
}

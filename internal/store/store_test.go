package store_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/storetest"
)

// sqliteFresh is a new database file per test; every Opener call opens another handle on it.
func sqliteFresh(t *testing.T) storetest.Opener {
	path := filepath.Join(t.TempDir(), "ferry.db")
	return func(t *testing.T) store.Store {
		t.Helper()
		s, err := store.OpenSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

func TestSQLiteContract(t *testing.T) { storetest.Run(t, sqliteFresh) }

func TestStoreFileIsOwnerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ferry.db")
	s, err := store.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("store file mode %o, want 600 (it holds secrets)", perm)
	}
}

package testcluster

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
)

// shared is the one cluster of a test binary: started by the first Shared call, stopped by Main.
var shared struct {
	mu      sync.Mutex
	inMain  bool
	once    sync.Once
	cluster *Cluster
	err     error
}

// Main runs the tests of a package that uses Shared, then stops the shared cluster. Call it from
// TestMain; it returns m.Run's exit code, which the test binary exits with when TestMain
// returns, so TestMain may clean up after it:
//
//	func TestMain(m *testing.M) { testcluster.Main(m) }
//
// When a test failed, the cluster's directory is kept and its path printed, for its logs.
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()

	code := m.Run()

	shared.mu.Lock()
	c := shared.cluster
	shared.mu.Unlock()
	if c != nil {
		if code != 0 {
			c.keepDir = true
			fmt.Fprintf(os.Stderr, "testcluster: tests failed; cluster logs kept in %s\n", c.Dir())
		}
		c.Stop()
	}
	return code
}

// Shared returns the test binary's cluster, starting it on first use. A cluster that cannot start
// fails the test: a missing prerequisite is an error, never a reason to skip. Tests sharing the
// cluster must not assume it is empty: give nodes and namespaces names of their own.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	shared.mu.Lock()
	inMain := shared.inMain
	shared.mu.Unlock()
	if !inMain {
		t.Fatal("testcluster.Shared needs testcluster.Main(m) in the package's TestMain, which stops the cluster")
	}
	shared.once.Do(func() {
		c, err := Start(context.Background(), Options{Logf: t.Logf})
		shared.mu.Lock()
		shared.cluster, shared.err = c, err
		shared.mu.Unlock()
	})
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.err != nil {
		t.Fatalf("start the test cluster: %v", shared.err)
	}
	return shared.cluster
}

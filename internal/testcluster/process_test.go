package testcluster

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// orphanHelperEnv makes the test binary act as a parent that starts a child and then waits to be
// killed; see TestChildDiesWithParent.
const orphanHelperEnv = "TESTCLUSTER_ORPHAN_HELPER_LOG"

// runOrphanHelper, called from TestMain, starts `sleep` the way components are started, prints
// its pid and blocks until killed.
func runOrphanHelper(logPath string) {
	p, err := startProcess("sleep", logPath, nil, "sleep", "600")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(p.cmd.Process.Pid)
	select {}
}

// TestChildDiesWithParent checks that a component does not outlive a test binary that is killed
// (say by go test's -timeout) without a chance to stop it.
func TestChildDiesWithParent(t *testing.T) {
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), orphanHelperEnv+"="+filepath.Join(t.TempDir(), "sleep.log"))
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = parent.Process.Kill()
		t.Fatalf("helper printed no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		_ = parent.Process.Kill()
		t.Fatalf("helper said %q", line)
	}
	if !alive(pid) {
		t.Fatalf("child %d is not running while its parent is", pid)
	}
	_ = parent.Process.Kill()
	_ = parent.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still runs 10s after its parent was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid runs: it exists and is not a zombie waiting for a reaper.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...; comm may hold spaces, so split after its closing parenthesis.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// TestClaimCIDRIsExclusive checks that concurrent claims get distinct loopback ranges, and that a
// released range leaves no lock file behind.
func TestClaimCIDRIsExclusive(t *testing.T) {
	const n = 40
	var mu sync.Mutex
	seen := map[string]bool{}
	var releases []func()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			cidr, release, err := claimCIDR(1)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[cidr] {
				t.Errorf("%s claimed twice", cidr)
			}
			seen[cidr] = true
			releases = append(releases, release)
		})
	}
	wg.Wait()
	for cidr := range seen {
		ip, network, err := net.ParseCIDR(cidr)
		if err != nil || !ip.IsLoopback() || network.String() != cidr {
			t.Errorf("claimed %q, want a loopback /24", cidr)
		}
		ones, _ := network.Mask.Size()
		if ones != 24 {
			t.Errorf("claimed %q, want a /24", cidr)
		}
	}
	for _, release := range releases {
		release()
	}
	for cidr := range seen {
		path := filepath.Join(os.TempDir(), "ferry-testcluster-cidrs", strings.TrimSuffix(cidr, "/24")+".lock")
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("lock file %s left after release (%v)", path, err)
		}
	}
}

// TestClaimWideCIDRHoldsEveryBlock checks that a range of several /24s is one aligned CIDR whose
// every /24 is locked: a /24 claimed meanwhile never falls inside it, and releasing it frees
// them all.
func TestClaimWideCIDRHoldsEveryBlock(t *testing.T) {
	wide, releaseWide, err := claimCIDR(4)
	if err != nil {
		t.Fatal(err)
	}
	_, wideNet, err := net.ParseCIDR(wide)
	if err != nil || wideNet.String() != wide {
		t.Fatalf("claimed %q, want an aligned CIDR (%v)", wide, err)
	}
	if ones, _ := wideNet.Mask.Size(); ones != 22 {
		t.Fatalf("claimed %q for 4 blocks, want a /22", wide)
	}
	base := wideNet.IP.To4()
	for i := range 4 {
		path := filepath.Join(os.TempDir(), "ferry-testcluster-cidrs", net.IPv4(127, base[1], base[2]+byte(i), 0).String()+".lock")
		if _, locked, err := lockFile(path); err != nil || locked {
			t.Errorf("%s: locked by a second claimant (%v), want held by the wide claim", path, err)
		}
	}
	var releases []func()
	for range 40 {
		narrow, release, err := claimCIDR(1)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
		if ip, _, _ := net.ParseCIDR(narrow); wideNet.Contains(ip) {
			t.Errorf("%s claimed inside the held %s", narrow, wide)
		}
	}
	for _, release := range releases {
		release()
	}
	releaseWide()
	for i := range 4 {
		path := filepath.Join(os.TempDir(), "ferry-testcluster-cidrs", net.IPv4(127, base[1], base[2]+byte(i), 0).String()+".lock")
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("lock file %s left after release (%v)", path, err)
		}
	}
	if _, _, err := claimCIDR(3); err == nil {
		t.Error("claimCIDR(3) succeeded, want an error: not a power of two")
	}
}

package vmjobtest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// EnvGangNode makes a test binary a node of a gang instead of running tests (its TestMain
// calls GangNode when it is set): rank 0 listens on the first of SKYPILOT_NODE_IPS and waits
// for every other rank, which dials it from its own address; each prints what it heard and
// exits 0. It stands in for a torchrun-style rendezvous over TCP.
const EnvGangNode = "FERRY_TEST_GANG_NODE"

// GangNode runs one node; it returns the process's exit status.
func GangNode() int {
	rank, _ := strconv.Atoi(os.Getenv(launcher.EnvNodeRank))
	n, _ := strconv.Atoi(os.Getenv(launcher.EnvNumNodes))
	ips := strings.Fields(os.Getenv(launcher.EnvNodeIPs))
	fmt.Printf("rank %d of %d, node ips %v\n", rank, n, ips)
	if len(ips) != n || n < 2 {
		fmt.Println("node ips do not match the gang")
		return 1
	}
	master := net.JoinHostPort(ips[0], os.Getenv("FERRY_PORT"))
	if rank == 0 {
		ln, err := net.Listen("tcp", master)
		if err != nil {
			fmt.Println("listen:", err)
			return 1
		}
		defer ln.Close()
		for range n - 1 {
			_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Minute))
			c, err := ln.Accept()
			if err != nil {
				fmt.Println("accept:", err)
				return 1
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			from, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			fmt.Printf("rank 0 heard %q from %s\n", strings.TrimSpace(line), from)
			_, _ = fmt.Fprintln(c, "welcome")
			_ = c.Close()
		}
		return 0
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ips[rank])}, Timeout: time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := d.Dial("tcp", master)
		if err != nil {
			if time.Now().After(deadline) {
				fmt.Println("dial:", err)
				return 1
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		_, _ = fmt.Fprintf(c, "hello from rank %d\n", rank)
		reply, _ := bufio.NewReader(c).ReadString('\n')
		_ = c.Close()
		fmt.Printf("rank %d got %q from rank 0 at %s\n", rank, strings.TrimSpace(reply), master)
		return 0
	}
}

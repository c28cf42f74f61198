package local

import (
	"slices"
	"testing"
)

// The supervisor's command line round-trips, and a broken one is an error, never a panic.
func TestParseSuperviseArgs(t *testing.T) {
	argv := []string{"bash", "-c", "exit 3", "--port", "--"}
	c, err := parseSuperviseArgs(superviseArgs("127.1.2.3", 8000, "", argv)[1:])
	if err != nil || c.workload || c.addr != "127.1.2.3" || c.port != 8000 || c.netns != "" || !slices.Equal(c.argv, argv) {
		t.Fatalf("parsed %+v (%v)", c, err)
	}
	c, err = parseSuperviseArgs(superviseArgs("127.255.2.3", 8000, "/h/local/netns.sock", argv)[1:])
	if err != nil || c.addr != "127.255.2.3" || c.netns != "/h/local/netns.sock" || !slices.Equal(c.argv, argv) {
		t.Fatalf("parsed %+v (%v)", c, err)
	}
	if c, err := parseSuperviseArgs([]string{"--workload", "--", "bash"}); err != nil || !c.workload {
		t.Fatalf("workload stage parsed %+v (%v)", c, err)
	}
	for _, bad := range [][]string{
		nil, {"--"}, {"--addr"}, {"--port", "x", "--", "a"}, {"--port", "0", "--", "a"},
		{"--port", "70000", "--", "a"}, {"--bogus", "--", "a"}, {"--addr", "127.0.0.2"}, {"--netns"},
	} {
		if _, err := parseSuperviseArgs(bad); err == nil {
			t.Errorf("parseSuperviseArgs(%q) accepted", bad)
		}
	}
}

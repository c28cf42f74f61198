package attach

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ferryserve/ferry/internal/home"
)

// TestControllerConnRotates: with several controller URLs each failure moves to the next, and
// the attach token comes from the proxy's home.
func TestControllerConnRotates(t *testing.T) {
	h := home.Home{Dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(h.Dir, "proxy.token"), []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cc := &controllerConn{home: h, urls: []string{"http://127.0.0.1:1001", "http://127.0.0.1:1002"}}
	var got []string
	for range 3 {
		c, addr, err := cc.client()
		if err != nil {
			t.Fatal(err)
		}
		if c.Token != "tok" {
			t.Fatalf("token %q, want the home's proxy.token", c.Token)
		}
		got = append(got, addr)
		cc.forget(errors.New("refused"))
	}
	want := []string{"http://127.0.0.1:1001", "http://127.0.0.1:1002", "http://127.0.0.1:1001"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("addresses in turn %v, want %v", got, want)
		}
	}
	// A follower's answer naming the leader: that URL next, once, then the list again.
	cc.forget(&NotLeaderError{Leader: "http://127.0.0.1:2000", Err: errors.New("503")})
	if _, addr, _ := cc.client(); addr != "http://127.0.0.1:2000" {
		t.Fatalf("after a follower named the leader: %s, want it", addr)
	}
	cc.forget(errors.New("refused"))
	if _, addr, _ := cc.client(); addr != "http://127.0.0.1:1002" {
		t.Fatalf("after the named leader failed too: %s, want the list's next", addr)
	}
	bad := &controllerConn{home: h, urls: []string{"127.0.0.1:1001"}}
	if _, _, err := bad.client(); err == nil {
		t.Fatal("a URL without a scheme accepted")
	}
}

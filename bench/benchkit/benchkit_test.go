package benchkit

import (
	"net"
	"strings"
	"testing"
)

func TestTableRender(t *testing.T) {
	tb := &Table{Header: []string{"target", "CPU µs"}, Rows: [][]string{{"ferry", "31.1"}, {"nginx", "27.8"}}}
	var b strings.Builder
	tb.Render(&b)
	want := `| target | CPU µs |
| ------ | ------ |
| ferry  | 31.1   |
| nginx  | 27.8   |
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestFreeLoopbackAddr(t *testing.T) {
	addr, err := FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address handed out cannot be bound: %v", err)
	}
	ln.Close()
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("addr %q is not on loopback", addr)
	}
}

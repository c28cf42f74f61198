package benchkit

import (
	"net"
	"os"
	"path/filepath"
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

func TestOutDirAndWriteReport(t *testing.T) {
	root := t.TempDir()
	dir, err := OutDir(root, "drv", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, filepath.Join(root, ".cache", "bench", "drv-")) {
		t.Errorf("default out dir %q", dir)
	}
	var stdout strings.Builder
	if err := WriteReport(&stdout, dir, "# report\n", map[string]int{"ok": 3}); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "summary.md"))
	js, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if string(md) != "# report\n" || string(js) != "{\n  \"ok\": 3\n}\n" {
		t.Errorf("summary.md %q, results.json %q", md, js)
	}
	if !strings.HasPrefix(stdout.String(), "# report\n") || !strings.Contains(stdout.String(), "results.json") {
		t.Errorf("stdout %q", stdout.String())
	}
}

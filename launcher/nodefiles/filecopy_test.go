package nodefiles

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// writeTree makes files (path -> content) and symbolic links (path -> target) under dir.
func writeTree(t *testing.T, dir string, files, links map[string]string) {
	t.Helper()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, target := range links {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, full); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSyncFilesLocalStaysInside: a symbolic link that one copy puts in the instance's files
// (a directory link or a file link, absolute or relative, leading out) does not make a later
// copy write outside them: the sync fails and the outside is untouched. A link that stays
// inside is written through as before, and links are still copied as links.
func TestSyncFilesLocalStaysInside(t *testing.T) {
	tests := map[string]struct {
		// links go into the first mount's source (mounted at /data); the second mount writes
		// second at /data/<into>.
		links   func(outside string) map[string]string
		into    string
		second  map[string]string // a directory's files; "" as the only key: a single file
		wantErr bool
		wantAt  string // with no error: where the second mount's file lands, under root
	}{
		"a directory link out, absolute": {
			links:   func(outside string) map[string]string { return map[string]string{"out": outside} },
			into:    "out",
			second:  map[string]string{"pwned.txt": "x"},
			wantErr: true,
		},
		"a directory link out, relative": {
			links: func(outside string) map[string]string {
				return map[string]string{"up": "../../../../../../../../../../" + outside}
			},
			into:    "up",
			second:  map[string]string{"pwned.txt": "x"},
			wantErr: true,
		},
		"a file link out, overwritten by a file mount": {
			links: func(outside string) map[string]string {
				return map[string]string{"cfg": filepath.Join(outside, "victim")}
			},
			into:    "cfg",
			second:  map[string]string{"": "x"},
			wantErr: true,
		},
		"a directory link inside": {
			links:  func(string) map[string]string { return map[string]string{"alias": "sub"} },
			into:   "alias",
			second: map[string]string{"ok.txt": "x"},
			wantAt: "data/sub/ok.txt",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			outside := t.TempDir()
			if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("keep"), 0o644); err != nil {
				t.Fatal(err)
			}
			first := t.TempDir()
			writeTree(t, first, map[string]string{"sub/keep.txt": "k"}, tc.links(outside))
			second := filepath.Join(t.TempDir(), "second")
			if content, single := tc.second[""]; single {
				if err := os.WriteFile(second, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				writeTree(t, second, tc.second, nil)
			}
			root := filepath.Join(t.TempDir(), "files")
			f := Files{Mounts: []FileMount{{Dst: "/data", Src: first}, {Dst: "/data/" + tc.into, Src: second}}}
			err := SyncFilesLocal(context.Background(), f, nil, t.TempDir(), root, filepath.Join(root, "home", "u"), nil)
			if tc.wantErr != (err != nil) {
				t.Fatalf("SyncFilesLocal: %v, want an error %v", err, tc.wantErr)
			}
			entries, _ := os.ReadDir(outside)
			if victim, _ := os.ReadFile(filepath.Join(outside, "victim")); len(entries) != 1 || string(victim) != "keep" {
				t.Errorf("the outside directory changed: %d entries, victim %q", len(entries), victim)
			}
			if tc.wantAt != "" {
				if _, err := os.Stat(filepath.Join(root, tc.wantAt)); err != nil {
					t.Errorf("the second mount's file: %v", err)
				}
			}
			for link, target := range tc.links(outside) {
				if got, err := os.Readlink(filepath.Join(root, "data", link)); err != nil || got != target {
					t.Errorf("link %s copied as %q (%v), want a link to %q", link, got, err, target)
				}
			}
		})
	}
}

// TestSyncFilesLocalWorkdirAndHome: the workdir lands in workdir, ~/ mounts under home, and a
// home outside the files root is refused rather than written outside it.
func TestSyncFilesLocalWorkdirAndHome(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a/b.txt": "b"}, map[string]string{"l": "a"})
	work, root := t.TempDir(), filepath.Join(t.TempDir(), "files")
	home := filepath.Join(root, "home", "u")
	f := Files{Workdir: src, Mounts: []FileMount{{Dst: "~/cfg", Src: src}}}
	if err := SyncFilesLocal(context.Background(), f, nil, work, root, home, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(work, "a/b.txt"), filepath.Join(home, "cfg/a/b.txt"), filepath.Join(home, "cfg/l/b.txt")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%v", err)
		}
	}
	if err := SyncFilesLocal(context.Background(), f, nil, work, root, t.TempDir(), nil); err == nil {
		t.Error("a home outside the files root was accepted")
	}
}

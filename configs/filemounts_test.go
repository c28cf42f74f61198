package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFileMountMappings(t *testing.T) {
	tests := map[string]struct {
		yaml    string
		want    map[string]string
		wantErr []wantErr
	}{
		"strings and a COPY mapping": {
			yaml: "run: x\nfile_mounts:\n  /data: ./data\n  /models:\n    source: s3://b/models\n    mode: COPY\n",
			want: map[string]string{"/data": "./data", "/models": "s3://b/models"},
		},
		"local source mapping, default mode": {
			yaml: "run: x\nfile_mounts:\n  /data:\n    source: ./data\n",
			want: map[string]string{"/data": "./data"},
		},
		"bucket mapping defaults to MOUNT": {
			yaml:    "run: x\nfile_mounts:\n  /ckpt:\n    source: gs://b/ckpt\n",
			wantErr: []wantErr{{4, 5, "file_mounts./ckpt.mode", "write mode: COPY"}},
		},
		"MOUNT_CACHED": {
			yaml:    "run: x\nfile_mounts:\n  /ckpt:\n    source: s3://b\n    mode: MOUNT_CACHED\n",
			wantErr: []wantErr{{5, 11, "file_mounts./ckpt.mode", "mounts the bucket with FUSE"}},
		},
		"a named bucket without a store": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    name: my-bucket\n    mode: MOUNT\n",
			wantErr: []wantErr{{4, 5, "file_mounts./out.store", "say which store holds the bucket"}},
		},
		"upload a local source": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    name: my-bucket\n    source: ./out\n",
			wantErr: []wantErr{{4, 5, "file_mounts./out.name", "uploads it to a new bucket"}},
		},
		"a list of sources": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    source: [a, b]\n",
			wantErr: []wantErr{{4, 13, "file_mounts./out.source", "mount each path on its own"}},
		},
		"unknown field": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    sourc: s3://b\n",
			wantErr: []wantErr{{4, 5, "file_mounts./out.sourc", "unknown field"}, {4, 5, "file_mounts./out", "without source"}},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			task, err := Parse("task.yaml", []byte(tt.yaml), Overrides{})
			if tt.wantErr != nil {
				if diff := cmp.Diff(tt.wantErr, project(Errors(err), tt.wantErr)); diff != "" {
					t.Fatalf("errors (-want +got):\n%s\n%v", diff, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, task.FileMounts); diff != "" {
				t.Errorf("FileMounts (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveFiles(t *testing.T) {
	cwd, home := t.TempDir(), t.TempDir()
	for _, d := range []string{filepath.Join(cwd, "app"), filepath.Join(home, "data")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	task := &Task{Workdir: "app", FileMounts: map[string]string{"/a": "~/data", "/b": "s3://x/y", "/c": "/abs"}}
	err := ResolveFiles(task, cwd, home)
	want := &Task{Workdir: filepath.Join(cwd, "app"), FileMounts: map[string]string{"/a": filepath.Join(home, "data"), "/b": "s3://x/y", "/c": "/abs"}}
	if diff := cmp.Diff(want, task); diff != "" {
		t.Errorf("resolved (-want +got):\n%s", diff)
	}
	if err == nil || !strings.Contains(err.Error(), "file_mounts./c: local path /abs does not exist") {
		t.Errorf("err = %v, want the missing /abs named", err)
	}
	task = &Task{Workdir: "missing"}
	if err := ResolveFiles(task, cwd, home); err == nil || !strings.Contains(err.Error(), "workdir: "+filepath.Join(cwd, "missing")+" does not exist") {
		t.Errorf("missing workdir: err = %v", err)
	}
}

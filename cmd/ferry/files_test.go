package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// TestPrintFiles: --dry-run lists what is copied, names the candidate infras that cannot take
// the files (a launch skips them) and refuses files that no candidate can take.
func TestPrintFiles(t *testing.T) {
	big := t.TempDir()
	noise := make([]byte, 64<<10) // random: does not compress; over EC2's 16 KiB, under 256 KiB
	_, _ = rand.Read(noise)
	if err := os.WriteFile(filepath.Join(big, "blob"), noise, 0o644); err != nil {
		t.Fatal(err)
	}
	cands := func(infras ...string) []optimizer.Candidate {
		var out []optimizer.Candidate
		for _, in := range infras {
			out = append(out, optimizer.Candidate{Placement: launcher.Placement{Infra: in}})
		}
		return out
	}
	tests := map[string]struct {
		task    configs.Task
		cands   []optimizer.Candidate
		wantOut []string
		wantErr string
	}{
		"too big for aws, fine for gcp": {
			task:    configs.Task{Workdir: big},
			cands:   cands("aws", "gcp"),
			wantOut: []string{"~/sky_workdir <- " + big, "aws cannot take them and is skipped", "16 KiB"},
		},
		"too big for the only candidate": {
			task:    configs.Task{Workdir: big},
			cands:   cands("aws"),
			wantErr: "no candidate infra can take the task's files",
		},
		"gs on kubernetes only": {
			task:    configs.Task{FileMounts: map[string]string{"/data": "gs://b/train"}},
			cands:   cands("kubernetes/ctx"),
			wantOut: []string{"/data <- gs://b/train (listed at launch)"},
			wantErr: "copy the data to s3://",
		},
		"missing local path": {
			task:    configs.Task{FileMounts: map[string]string{"/data": "/nonexistent/ferry"}},
			cands:   cands("local"),
			wantErr: "does not exist",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			err := printFiles(&out, &tt.task, tt.cands)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

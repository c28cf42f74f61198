package gcp

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/jobboot-*.golden from the current renderer")

// TestJobBootGolden pins the script a job node boots with, with and without a shared checkpoint
// filesystem: what runs on the VM changes only with a reviewed change to testdata (go test
// -run TestJobBootGolden -update).
func TestJobBootGolden(t *testing.T) {
	for name, nfs := range map[string]string{"local": "", "nfs": "10.0.0.2:/checkpoints"} {
		t.Run(name, func(t *testing.T) {
			s := jobSpecFor("train", "pip install -r requirements.txt", "python train.py", true)
			s.Job.CheckpointClaim = launcher.CheckpointClaim("7")
			got, err := jobBoot(s, nfs)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "jobboot-"+name+".golden")
			if *updateGolden {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(want), got); d != "" {
				t.Fatalf("job boot script (-%s +rendered):\n%s", path, d)
			}
		})
	}
}

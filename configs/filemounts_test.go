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
		yaml      string
		want      map[string]string
		wantModes map[string]MountMode
		wantErr   []wantErr
	}{
		"strings and a COPY mapping": {
			yaml: "run: x\nfile_mounts:\n  /data: ./data\n  /models:\n    source: s3://b/models\n    mode: COPY\n",
			want: map[string]string{"/data": "./data", "/models": "s3://b/models"},
		},
		"local source mapping, default mode": {
			yaml: "run: x\nfile_mounts:\n  /data:\n    source: ./data\n",
			want: map[string]string{"/data": "./data"},
		},
		// SkyPilot's docs/source/reference/storage.rst, "Use an existing bucket".
		"bucket mapping defaults to MOUNT": {
			yaml:      "run: x\nfile_mounts:\n  /my_data:\n    source: s3://my-bucket/  # or gs://\n    mode: MOUNT  # How buckets are mounted to nodes. MOUNT or COPY or MOUNT_CACHED. Defaults to MOUNT. Optional.\n",
			want:      map[string]string{"/my_data": "s3://my-bucket/"},
			wantModes: map[string]MountMode{"/my_data": ModeMount},
		},
		"no mode is MOUNT": {
			yaml:      "run: x\nfile_mounts:\n  /ckpt:\n    source: gs://b/ckpt\n",
			want:      map[string]string{"/ckpt": "gs://b/ckpt"},
			wantModes: map[string]MountMode{"/ckpt": ModeMount},
		},
		"MOUNT_CACHED": {
			yaml:      "run: x\nfile_mounts:\n  /checkpoints_cached:\n    source: s3://your-bucket\n    mode: MOUNT_CACHED # Local caching + object store persistence\n",
			want:      map[string]string{"/checkpoints_cached": "s3://your-bucket"},
			wantModes: map[string]MountMode{"/checkpoints_cached": ModeMountCached},
		},
		// SkyPilot's examples/spot/resnet.yaml: an existing bucket by name, on an AWS task.
		"name on an aws task": {
			yaml: `name: resnet
resources:
    accelerators: V100:4
    cloud: aws
file_mounts:
    /checkpoint:
        name: checkpoint-bucket-resnet
        mode: MOUNT
run: x
`,
			want:      map[string]string{"/checkpoint": "s3://checkpoint-bucket-resnet"},
			wantModes: map[string]MountMode{"/checkpoint": ModeMount},
		},
		// SkyPilot's llm/llama-3_1-finetuning/lora.yaml: no cloud, no store.
		"name with an env and no store": {
			yaml: `envs:
  CHECKPOINT_BUCKET_NAME: sky-llama-31-checkpoints
resources:
  accelerators: A100:8
file_mounts:
  /output:
    name: $CHECKPOINT_BUCKET_NAME
    mode: MOUNT
    # Optionally, specify the store to enforce to use one of the stores below:
    #   r2/azure/gcs/s3/cos
    # store: r2
run: x
`,
			want:      map[string]string{"/output": "s3://sky-llama-31-checkpoints"},
			wantModes: map[string]MountMode{"/output": ModeMount},
		},
		"name on a gcp task": {
			yaml:      "resources: {infra: gcp/us-central1}\nfile_mounts:\n  /ckpt: {name: b, mode: MOUNT_CACHED}\nrun: x\n",
			want:      map[string]string{"/ckpt": "gs://b"},
			wantModes: map[string]MountMode{"/ckpt": ModeMountCached},
		},
		// SkyPilot's docs/source/reference/storage.rst, "Storing model checkpoints".
		"name with store gcs": {
			yaml: `file_mounts:
  /my_checkpoint:
    name: my-sky-bucket
    store: gcs
    mode: MOUNT_CACHED
run: x
`,
			want:      map[string]string{"/my_checkpoint": "gs://my-sky-bucket"},
			wantModes: map[string]MountMode{"/my_checkpoint": ModeMountCached},
		},
		"name with store s3, COPY": {
			yaml: "file_mounts:\n  /d: {name: data, store: s3, mode: COPY}\nrun: x\n",
			want: map[string]string{"/d": "s3://data"},
		},
		"store SkyPilot has and Ferry lacks": {
			yaml:    "file_mounts:\n  /d: {name: data, store: r2}\nrun: x\n",
			wantErr: []wantErr{{2, 27, "file_mounts./d.store", "not supported by Ferry"}},
		},
		"name and source disagree": {
			yaml:    "file_mounts:\n  /d: {name: a, source: s3://b/x}\nrun: x\n",
			wantErr: []wantErr{{2, 14, "file_mounts./d.name", "not the bucket of source"}},
		},
		"name that is a URL": {
			yaml:    "file_mounts:\n  /d: {name: 's3://a'}\nrun: x\n",
			wantErr: []wantErr{{2, 14, "file_mounts./d.name", "not a bucket name"}},
		},
		"a new bucket": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    store: s3\n    mode: MOUNT\n",
			wantErr: []wantErr{{4, 5, "file_mounts./out", "Ferry does not create"}},
		},
		"upload a local source": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    name: my-bucket\n    source: ./out\n",
			wantErr: []wantErr{{4, 5, "file_mounts./out.name", "uploads it to a new bucket"}},
		},
		"a list of sources": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    source: [a, b]\n",
			wantErr: []wantErr{{4, 13, "file_mounts./out.source", "mount each path on its own"}},
		},
		"unknown mode": {
			yaml:    "run: x\nfile_mounts:\n  /out:\n    source: s3://b\n    mode: MOUNTED\n",
			wantErr: []wantErr{{5, 11, "file_mounts./out.mode", "valid modes: COPY, MOUNT, MOUNT_CACHED"}},
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
			if diff := cmp.Diff(tt.wantModes, task.MountModes); diff != "" {
				t.Errorf("MountModes (-want +got):\n%s", diff)
			}
			out, err := task.ResolvedYAML()
			if err != nil {
				t.Fatal(err)
			}
			assertRoundTrip(t, task, out)
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

// TestMountInstanceProfile: aws.mount_instance_profile names the IAM instance profile of VMs
// that mount s3:// buckets; an ARN is refused with what to write.
func TestMountInstanceProfile(t *testing.T) {
	cfg, err := ParseFerryConfig("config.yaml", []byte("aws:\n  mount_instance_profile: ferry-mounts\n"))
	if err != nil || cfg.AWS.MountInstanceProfile != "ferry-mounts" {
		t.Fatalf("cfg %+v, err %v", cfg, err)
	}
	_, err = ParseFerryConfig("config.yaml", []byte("aws:\n  mount_instance_profile: arn:aws:iam::123:instance-profile/x\n"))
	want := []wantErr{{2, 27, "aws.mount_instance_profile", "not the ARN"}}
	if diff := cmp.Diff(want, project(Errors(err), want)); diff != "" {
		t.Errorf("errors (-want +got):\n%s\n%v", diff, err)
	}
}

package local

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ferryserve/ferry/configs"
)

// metadata is what instance.json holds: enough to find, check and stop a replica's process group
// from a later controller process. It never holds the environment, which carries secrets.
type metadata struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	PID    int               `json:"pid"`
	PGID   int               `json:"pgid"`
	// StartTime is /proc/<pid>/stat field 22, to tell our process from a later one with the
	// same pid.
	StartTime  uint64    `json:"start_time"`
	Endpoint   string    `json:"endpoint"`
	LaunchedAt time.Time `json:"launched_at"`
	// WorkDir is the working directory Launch made for the replica, removed with it; empty
	// when the task named its own.
	WorkDir string `json:"work_dir,omitempty"`
	// ExitReason and ExitedAt are written by the controller process that started the replica,
	// the only one that can wait for it and so learn its exit status.
	ExitReason string    `json:"exit_reason,omitempty"`
	ExitedAt   time.Time `json:"exited_at,omitzero"`
	// ExitCode is the program's status when it ended by itself (not by a signal).
	ExitCode *int `json:"exit_code,omitempty"`
	// Host is the instance's own loopback address: a job's node's, or a replica's whose run
	// fixes its port; empty for replicas that share Options.Host.
	Host string `json:"host,omitempty"`
	// StopGrace is the job's grace between SIGTERM and SIGKILL; zero means Options.StopGrace.
	StopGrace time.Duration `json:"stop_grace,omitempty"`
	// Job marks a job's node: its script runs under a wrapper that records the exit status in
	// exitStatusFile, so that a later controller, which cannot wait for it, still learns it.
	Job bool `json:"job,omitempty"`
	// GPU, CPUs and MemoryGiB are what the instance holds of the machine's declared capacity
	// (capacity.go), with its Priority and whether a higher one may preempt it.
	GPU         *configs.Accelerator `json:"gpu,omitempty"`
	CPUs        float64              `json:"cpus,omitempty"`
	MemoryGiB   float64              `json:"memory_gib,omitempty"`
	Priority    int                  `json:"priority,omitempty"`
	Preemptible bool                 `json:"preemptible,omitempty"`
	// PreemptedBy says why the instance was preempted for another launch: it lists as
	// PREEMPTED from then on.
	PreemptedBy string `json:"preempted_by,omitempty"`
}

const (
	metadataFile = "instance.json"
	logFile      = "output.log"
	scriptFile   = "run.sh"
	logsDir      = "logs"
	// checkpointsDir is the default CheckpointRoot, beside the instances.
	checkpointsDir = "checkpoints"
	// exitStatusFile holds a job node's exit status, written by its wrapper as it ends.
	exitStatusFile = "exit_status"
)

func loadMetadata(dir string) (*metadata, error) {
	data, err := os.ReadFile(filepath.Join(dir, metadataFile))
	if err != nil {
		return nil, err
	}
	var m metadata
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, metadataFile), err)
	}
	return &m, nil
}

// saveMetadata writes instance.json atomically (temp file + rename) so that a reader in another
// controller never sees half a file. It does not create dir: a directory removed by Terminate
// stays removed.
func saveMetadata(dir string, m *metadata) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, metadataFile+".tmp*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, metadataFile)); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return nil
}

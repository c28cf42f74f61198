package gcp

import (
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher/gcp/fakecompute"
	"github.com/ferryserve/ferry/launcher/internal/vmjobtest"
)

// Terminating a running job node gives its program SIGTERM and its grace period, with the
// grace in the preemption file, and deletes the VM once the program has checkpointed.
func TestTerminateJobNodeWithGrace(t *testing.T) {
	e := newEnv(t, fakecompute.Options{}, Options{})
	ctx := testCtx(t)
	s := jobSpecFor("stopped", "", vmjobtest.PreemptibleRun, false)
	s.Job.Grace = 3 * time.Second
	in, err := e.prov.Launch(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	c := e.cloud()
	vmjobtest.WaitTraining(t, c, in)
	if err := e.prov.Terminate(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	log := c.Console(in)
	if !strings.Contains(log, "SIGTERM with FERRY_PREEMPTION_GRACE_SECONDS=3") || !strings.Contains(log, "checkpointed") {
		t.Fatalf("the program was not stopped with its grace before the VM went:\n%s", log)
	}
	if _, _, ok := e.fake.Instance(in.Name); ok {
		t.Error("Terminate left the VM")
	}
}

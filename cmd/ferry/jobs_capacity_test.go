package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/jobs"
)

// `ferry jobs queue` says why and since when a queued job waits, and when a running one's
// max_run_duration stops it.
func TestJobsQueueShowsCapacity(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	waiting := api.JobStatus{Job: jobs.Job{ID: 1, Name: "train", State: jobs.Pending, SubmittedAt: now.Add(-time.Hour),
		WaitingSince: now.Add(-time.Hour), InQueue: true,
		Reason: "waiting for capacity: since 2026-11-26T11:00:00Z: queued: ProvisioningRequest train-1-1 is not Provisioned yet"}}
	running := api.JobStatus{Job: jobs.Job{ID: 2, Name: "eval", State: jobs.Running, SubmittedAt: now.Add(-time.Hour), RunUntil: now.Add(time.Hour)}}
	var buf bytes.Buffer
	printJobs(&buf, []api.JobStatus{waiting, running}, now)
	for _, want := range []string{"PENDING", "since 2026-11-26T11:00:00Z: queued: ProvisioningRequest", "max_run_duration stops it at 2026-11-26T13:00:00Z"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("queue lacks %q:\n%s", want, buf.String())
		}
	}
}

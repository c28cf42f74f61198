package main

import (
	"testing"
	"time"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/jobs"
)

// TestJobDetails: the DETAILS column names the limit that stops a running job (its
// reservation's end is not max_run_duration), and a recovery's loss reads as a duration and a
// count in good English, also when it is under a second.
func TestJobDetails(t *testing.T) {
	until := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		job  jobs.Job
		want string
	}{
		"max_run_duration": {jobs.Job{State: jobs.Running, RunUntil: until, RunLimit: "max_run_duration"},
			"max_run_duration stops it at 2026-11-29T12:00:00Z"},
		"reservation": {jobs.Job{State: jobs.Running, RunUntil: until, RunLimit: "reservation"},
			"its reservation's end stops it at 2026-11-29T12:00:00Z"},
		"one recovery under a second": {jobs.Job{State: jobs.Running, History: []jobs.Recovery{{Lost: 300 * time.Millisecond}}},
			"lost <1s to 1 recovery"},
		"two recoveries": {jobs.Job{State: jobs.Succeeded, History: []jobs.Recovery{{Lost: 50 * time.Second}, {Lost: 70 * time.Second}}},
			"lost 2m 0s to 2 recoveries"},
	} {
		if got := details(api.JobStatus{Job: tc.job}); got != tc.want {
			t.Errorf("%s: details %q, want %q", name, got, tc.want)
		}
	}
}

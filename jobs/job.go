// Package jobs runs training and batch jobs on the provisioner services use: SkyPilot's
// managed jobs, with gangs, a priority queue, recovery from preemptions and lost nodes, and
// restarts on errors.
//
// A job is a task without `service:`. Its life is SkyPilot's ManagedJobStatus: PENDING (in
// the queue) → STARTING (its gang launching) → RUNNING ↔ RECOVERING → SUCCEEDED, FAILED,
// FAILED_SETUP, FAILED_NO_RESOURCE, FAILED_CONTROLLER or CANCELLED (through CANCELLING).
// The Manager owns every job: the queue (queue.go), launching a gang (launch.go), watching
// its nodes and judging how they ended (watch.go, assess.go), and an elastic job's size
// (elastic.go: SkyPilot's DYNAMIC_NODE_SET). Every state is saved before it
// is acted on, so that a controller killed at any point adopts what runs and launches nothing
// twice (Manager.Start).
//
// It imports configs and launcher only: it never learns which cloud runs a node, nor that
// services exist — it meets them only as capacity the provisioner cannot give.
package jobs

import (
	"slices"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// State is a job's status, SkyPilot's names.
type State string

// Job states.
const (
	Pending          State = "PENDING"
	Starting         State = "STARTING"
	Running          State = "RUNNING"
	Recovering       State = "RECOVERING"
	Cancelling       State = "CANCELLING"
	Succeeded        State = "SUCCEEDED"
	Failed           State = "FAILED"
	FailedSetup      State = "FAILED_SETUP"
	FailedNoResource State = "FAILED_NO_RESOURCE"
	FailedController State = "FAILED_CONTROLLER"
	Cancelled        State = "CANCELLED"
)

// Terminal reports whether a job in s is over for good.
func (s State) Terminal() bool {
	switch s {
	case Succeeded, Failed, FailedSetup, FailedNoResource, FailedController, Cancelled:
		return true
	}
	return false
}

// Job is one job as the store keeps it and the API shows it.
type Job struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Task holds secrets: the store file is 0600 and the API shows Task.Redacted(). In a
	// pipeline it is the task now running or next to run: Pipeline[TaskIndex].
	Task *configs.Task `json:"task"`
	// Pipeline is every task of a pipeline (configs.Pipeline), run in order, each once the one
	// before succeeded; nil for a job of one task. TaskIndex is Task's place in it.
	Pipeline  []*configs.Task `json:"pipeline,omitempty"`
	TaskIndex int             `json:"task_index,omitempty"`
	State     State           `json:"state"`
	// Reason says why the job is in its state: what it waits for, why it failed.
	Reason string `json:"reason,omitempty"`
	// TaskID is SKYPILOT_TASK_ID, the same across recoveries (taskID).
	TaskID string `json:"task_id"`
	// Priority and Preemptible are the task's job section, kept here for the queue.
	Priority    int  `json:"priority"`
	Preemptible bool `json:"preemptible"`

	SubmittedAt time.Time `json:"submitted_at"`
	// StartedAt is when the job first ran; EndedAt when it reached a terminal state.
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// StateSince is when the job entered State; the durations below add each state's time
	// as the job leaves it.
	StateSince time.Time     `json:"state_since"`
	Queued     time.Duration `json:"queued"`
	Ran        time.Duration `json:"ran"`
	Recovered  time.Duration `json:"recovered"`

	// Attempt counts launch tries (1 the first), those that found no capacity included; nodes
	// carry it in launcher.LabelAttempt, so every try's nodes are told apart.
	Attempt int `json:"attempt"`
	// Recoveries counts relaunches after a lost node; RestartsOnErrors those after a failing
	// program (configs.JobRecovery.MaxRestartsOnErrors bounds them).
	Recoveries       int `json:"recoveries"`
	RestartsOnErrors int `json:"restarts_on_errors"`
	// Resizes counts an elastic job's relaunches at a larger size (elastic.go).
	Resizes int        `json:"resizes,omitempty"`
	History []Recovery `json:"history,omitempty"`
	// GangSize is the size of the current (or last tried) gang: num_nodes, or fewer for an
	// elastic job (DYNAMIC_NODE_SET); 0 in jobs saved before it was kept, which is num_nodes.
	GangSize int `json:"gang_size,omitempty"`
	// Nodes is the current gang, rank order; empty while none runs.
	Nodes []Node `json:"nodes,omitempty"`
	// ExitCodes are the last gang's statuses by rank (-1: did not exit by itself).
	ExitCodes []int `json:"exit_codes,omitempty"`
	// Cost is what the job's nodes cost so far, in dollars; CostSince is when it was last
	// added up.
	Cost      float64   `json:"cost"`
	CostSince time.Time `json:"cost_since,omitzero"`

	// WaitingSince is when the job began waiting for capacity (the cloud's own time for a
	// queued request), zero while it is not waiting; InQueue says its last launch is held in
	// a cloud's queue (launcher.ErrQueued), which the next try finds again (capacity.go).
	WaitingSince time.Time `json:"waiting_since,omitzero"`
	InQueue      bool      `json:"in_queue,omitempty"`
	// RunUntil is when the current gang is stopped: its start plus capacity.max_run_duration,
	// or its grace before its reservation ends if that is sooner; RunLimit says which.
	RunUntil time.Time `json:"run_until,omitzero"`
	RunLimit string    `json:"run_limit,omitempty"`
	// PreemptFor, set while the job runs, says that a higher-priority job preempts it
	// (preempt.go): its watch ends the gang as lost and clears it. PreemptedAt is when that
	// last happened, which keeps the job safe from another preemption for a while.
	PreemptFor  string    `json:"preempt_for,omitempty"`
	PreemptedAt time.Time `json:"preempted_at,omitzero"`
	// LeftBehind is what stopping the job's nodes could not reach (an infra that did not
	// answer): the provisioner's janitor stops it once the infra answers again.
	LeftBehind []launcher.Leftover `json:"left_behind,omitempty"`
}

// Node is one node of a job's current gang.
type Node struct {
	Rank       int     `json:"rank"`
	InstanceID string  `json:"instance_id"`
	IP         string  `json:"ip,omitempty"`
	Infra      string  `json:"infra"`
	Region     string  `json:"region,omitempty"`
	Zone       string  `json:"zone,omitempty"`
	Spot       bool    `json:"spot,omitempty"`
	Price      float64 `json:"price_per_hour"`
	// ReclaimAt is when the node's infra warned it would take it back (a spot interruption
	// warning); zero when not warned.
	ReclaimAt time.Time `json:"reclaim_at,omitzero"`
	// WindowEnd is when the reservation the node runs in ends, and the node with it.
	WindowEnd time.Time `json:"window_end,omitzero"`
}

// Recovery is one relaunch: why, from where, and how long the job was not running.
type Recovery struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
	// From is where the lost gang ran (infra/zone); To where the new one runs.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
	// ResumedAt is when the new gang was up; Lost is ResumedAt − At (zero until resumed).
	ResumedAt time.Time     `json:"resumed_at,omitzero"`
	Lost      time.Duration `json:"lost,omitempty"`
	// OnError marks a restart after the program failed, rather than a lost node.
	OnError bool `json:"on_error,omitempty"`
	// Resize marks an elastic job's relaunch at a larger size, once capacity returned.
	Resize bool `json:"resize,omitempty"`
}

// PricePerHour is what the current gang costs per hour.
func (j *Job) PricePerHour() float64 {
	var sum float64
	for _, n := range j.Nodes {
		sum += n.Price
	}
	return sum
}

// Where names where the gang runs ("aws/us-east-1a", "local"), "" when none does.
func (j *Job) Where() string {
	if len(j.Nodes) == 0 {
		return ""
	}
	n := j.Nodes[0]
	switch {
	case n.Zone != "":
		return n.Infra + "/" + n.Zone
	case n.Region != "":
		return n.Infra + "/" + n.Region
	}
	return n.Infra
}

// clone is a deep copy, for callers outside the manager's lock.
func (j *Job) clone() Job {
	c := *j
	c.Nodes = slices.Clone(j.Nodes)
	c.History = slices.Clone(j.History)
	c.ExitCodes = slices.Clone(j.ExitCodes)
	c.LeftBehind = slices.Clone(j.LeftBehind)
	c.Pipeline = slices.Clone(j.Pipeline)
	return c
}

// setState moves the job to s at now: the time spent in the old state is added to its bucket,
// the cost of the nodes held meanwhile to Cost, and the terminal time set once.
func (j *Job) setState(s State, reason string, now time.Time) {
	j.account(now)
	if !j.StateSince.IsZero() {
		d := now.Sub(j.StateSince)
		switch j.State {
		case Pending, Starting:
			j.Queued += d
		case Running:
			j.Ran += d
		case Recovering:
			j.Recovered += d
		}
	}
	if s == Running && j.StartedAt.IsZero() {
		j.StartedAt = now
	}
	if s.Terminal() && j.EndedAt.IsZero() {
		j.EndedAt = now
	}
	j.State, j.Reason, j.StateSince = s, reason, now
}

// account adds the cost of the nodes held since CostSince.
func (j *Job) account(now time.Time) {
	if !j.CostSince.IsZero() && now.After(j.CostSince) {
		j.Cost += j.PricePerHour() * now.Sub(j.CostSince).Hours()
	}
	j.CostSince = now
}

// Elapsed returns the job's time queued, running and recovering up to now, counting the
// current state's share.
func (j *Job) Elapsed(now time.Time) (queued, ran, recovered time.Duration) {
	queued, ran, recovered = j.Queued, j.Ran, j.Recovered
	if j.State.Terminal() || j.StateSince.IsZero() {
		return
	}
	d := now.Sub(j.StateSince)
	switch j.State {
	case Pending, Starting:
		queued += d
	case Running:
		ran += d
	case Recovering:
		recovered += d
	}
	return
}

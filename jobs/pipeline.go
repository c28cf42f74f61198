package jobs

import (
	"fmt"

	"github.com/ferryserve/ferry/configs"
)

// Pipelines, as SkyPilot's managed jobs run them: a job of ordered tasks (configs.Pipeline)
// runs one task at a time, each as a job of its own would run (its resources, num_nodes,
// recovery and restarts), the next once the last succeeded; a task that fails or is cancelled
// ends the job, and the tasks after it never run. Between tasks the job goes back to the queue
// PENDING, so the next task is placed as any job is; attempts go on counting, so every task's
// nodes and logs stay apart. The tasks share the job's checkpoint storage.

// toTask makes task i of j's pipeline (or its only task, i == 0) the one j runs next: its job
// section sets the queue's priority and whether it may be preempted, and its error restarts
// start from zero.
func (j *Job) toTask(i int) {
	if len(j.Pipeline) > 0 {
		j.Task = j.Pipeline[i]
	}
	j.TaskIndex = i
	spec := configs.DefaultJob()
	if j.Task.Job != nil {
		spec = *j.Task.Job
	}
	j.Priority, j.Preemptible = spec.Priority, spec.Preemptible
	if i > 0 {
		j.RestartsOnErrors = 0
		j.TaskID = taskID(*j)
	}
}

// taskID is SKYPILOT_TASK_ID in SkyPilot's managed form, stable across recoveries:
// sky-managed-<submitted>_<job name>_<job id>-<task index>, with the task's name before the
// job id in a pipeline (sky-managed-<submitted>_<job name>_<task name>_<job id>-<task index>).
func taskID(j Job) string {
	at := j.SubmittedAt.UTC()
	name := j.Name
	if len(j.Pipeline) > 0 && j.Task != nil && j.Task.Name != "" {
		name += "_" + j.Task.Name
	}
	return fmt.Sprintf("sky-managed-%s-%06d_%s_%d-%d", at.Format("2006-01-02-15-04-05"), at.Nanosecond()/1000, name, j.ID, j.TaskIndex)
}

// nextTask reports whether j's pipeline has a task after the current one.
func (j Job) nextTask() bool { return j.TaskIndex+1 < len(j.Pipeline) }

// taskPrefix is "task 2/3 (eval): " for a pipeline's reasons, "" for a job of one task.
func (j Job) taskPrefix() string {
	if len(j.Pipeline) == 0 {
		return ""
	}
	name := ""
	if j.Task != nil && j.Task.Name != "" {
		name = " (" + j.Task.Name + ")"
	}
	return fmt.Sprintf("task %d/%d%s: ", j.TaskIndex+1, len(j.Pipeline), name)
}

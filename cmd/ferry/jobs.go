package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/jobs"
	"github.com/ferryserve/ferry/launcher"
)

func init() { register(newJobsCmd) }

func newJobsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "Launch, watch and cancel training and batch jobs (managed, with recovery)",
		Long: `A task YAML without a service: section is a job. Ferry queues it, launches its gang of
num_nodes nodes on the same provisioner as services (Kubernetes first, then clouds by price),
restarts it on errors as resources.job_recovery allows, and recovers it elsewhere when a node is
preempted or lost. States are SkyPilot's managed-job states.`,
		Example: `  ferry jobs launch configs/examples/train-torchrun.yaml
  ferry jobs launch batch.yaml -n nightly --env PROMPTS=prompts.jsonl -d
  ferry jobs queue
  ferry jobs logs nightly --node 1 -f
  ferry jobs cancel 3 -y`,
	}
	cmd.AddCommand(newJobsLaunchCmd(), newJobsQueueCmd(), newJobsLogsCmd(), newJobsCancelCmd())
	return cmd
}

type jobLaunchFlags struct {
	name   string
	detach bool
	dryRun bool
	taskInput
}

func newJobsLaunchCmd() *cobra.Command {
	var f jobLaunchFlags
	cmd := &cobra.Command{
		Use:   "launch FILE",
		Short: "Queue a job and stream its logs until it ends (its exit status is the command's)",
		Long: `Validate the task YAML, show the resolved spec and the placement plan, and queue the job.
Without -d, stream node 0's output until the job ends and exit with its status: 0 when it
SUCCEEDED, the failing node's exit status when it FAILED, 1 otherwise. Ctrl-C stops streaming;
the job goes on (cancel it with ferry jobs cancel).`,
		Example: `  ferry jobs launch configs/examples/train-torchrun.yaml
  ferry jobs launch train.yaml -n finetune --env EPOCHS=3 --secret HF_TOKEN -y -d`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return jobsLaunch(cmd, args[0], f) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.name, "name", "n", "", "job name (default: the task's name)")
	fl.BoolVarP(&f.detach, "detach", "d", false, "return once the job is queued, without streaming its logs")
	fl.BoolVar(&f.dryRun, "dry-run", false, "validate and print the plan without launching")
	f.register(fl, "same as -d", "unused by jobs", 0)
	_ = fl.MarkHidden("wait-timeout")
	_ = fl.MarkHidden("no-wait")
	return cmd
}

func jobsLaunch(cmd *cobra.Command, file string, f jobLaunchFlags) error {
	out := cmd.OutOrStdout()
	p, err := f.loadPipeline(file, f.name, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if p.Tasks[0].Service != nil {
		return fmt.Errorf("%s has a service: section, so it is a service: ferry serve up %s", file, file)
	}
	name := p.Name
	if name == "" {
		name = "job"
	}
	if proceed, err := reviewTasks(cmd, p.Tasks, "managed job", name, f.dryRun, f.yes); !proceed {
		return err
	}
	ctx, stop, c, err := controllerFor(cmd, out)
	if err != nil {
		return err
	}
	defer stop()
	st, err := c.LaunchPipeline(ctx, p)
	if err != nil {
		return err
	}
	id := strconv.FormatInt(st.ID, 10)
	fmt.Fprintf(out, "⚙︎ Managed job %q queued. ID: %s\n", st.Name, id)
	if f.detach || f.noWait {
		fmt.Fprintf(out, "  ferry jobs logs %s -f\n  ferry jobs queue\n  ferry jobs cancel %s\n", id, id)
		return nil
	}
	return streamUntilEnd(ctx, c, id, out)
}

// streamUntilEnd follows node 0's output until the job ends, then prints how it ended and
// turns it into the command's exit status.
func streamUntilEnd(ctx context.Context, c *api.Client, id string, out io.Writer) error {
	if err := c.JobLogs(ctx, id, 0, true, out); err != nil {
		return err
	}
	if ctx.Err() != nil {
		fmt.Fprintf(out, "\nStopped streaming; job %s goes on. Follow it with: ferry jobs logs %s -f\n", id, id)
		return nil
	}
	// The log stream ends with the job; its final record may lag the stream by a moment.
	var st api.JobStatus
	for {
		var err error
		if st, err = c.Job(ctx, id); err != nil {
			return err
		}
		if st.State.Terminal() || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	mark := "✓"
	if st.State != jobs.Succeeded {
		mark = "✗"
	}
	fmt.Fprintf(out, "%s Managed job %s finished (status: %s)%s\n", mark, id, st.State, because(st.Reason))
	return jobExit(st)
}

func because(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

// jobExit is the exit status of `jobs launch` for a job that ended as st.
func jobExit(st api.JobStatus) error {
	switch st.State {
	case jobs.Succeeded:
		return nil
	case jobs.Failed:
		for _, code := range st.ExitCodes {
			if code > 0 {
				return exitCodeError{code: code}
			}
		}
	}
	return exitCodeError{code: 1}
}

func newJobsQueueCmd() *cobra.Command {
	var asJSON, all bool
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "List jobs: unfinished ones and those that ended in the last hour (--all: every one)",
		Long: `List jobs: unfinished ones and those that ended in the last hour (--all: every one). Under the
table, a line for each infra (or zone or region) that does not take calls now: launches skip it
and the jobs whose nodes run there are kept as last seen until it answers again.`,
		Example: `  ferry jobs queue
  ferry jobs queue --all
  ferry jobs queue --json | jq '.[] | {id, state, recoveries}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			list, err := c.Jobs(ctx)
			if err != nil {
				return err
			}
			now := time.Now()
			if !all {
				list = slices.DeleteFunc(list, func(j api.JobStatus) bool {
					return j.State.Terminal() && now.Sub(j.EndedAt) > time.Hour
				})
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			printJobs(out, list, now)
			// A controller from before /v1/infras answers 404: the table is all it can say.
			if health, err := c.Infras(ctx); err == nil {
				printInfrasNotUp(out, health, now)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the jobs as JSON")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include jobs that ended more than an hour ago")
	return cmd
}

// printJobs is `sky jobs queue`'s table, with where each job runs and what it costs.
func printJobs(out io.Writer, list []api.JobStatus, now time.Time) {
	if len(list) == 0 {
		fmt.Fprintln(out, "No jobs.")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTASK\tNAME\tNODES\tRESOURCES\tSUBMITTED\tQUEUED\tRUNNING\tRECOVERING\t#RECOVERIES\tSTATUS\tWHERE\t$/HR\tCOST\tDETAILS")
	for _, j := range list {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s ago\t%s\t%s\t%s\t%d\t%s\t%s\t%.2f\t%.2f\t%s\n", j.ID, taskCell(j), j.Name, j.NumNodes, orDash(j.Resources),
			short(now.Sub(j.SubmittedAt)), short(secs(j.QueuedSeconds)), short(secs(j.RunningSeconds)), short(secs(j.RecoveringSeconds)),
			j.Recoveries+j.RestartsOnErrors, j.State, orDash(j.Where), j.PricePerHour, j.Cost, details(j))
	}
	_ = tw.Flush()
}

// taskCell is the TASK column: a pipeline's current task as "2/3 eval", else "-" (a job of
// one task, SkyPilot's task 0).
func taskCell(j api.JobStatus) string {
	if len(j.Pipeline) == 0 || j.Task == nil {
		return "-"
	}
	return strings.TrimSpace(fmt.Sprintf("%d/%d %s", j.TaskIndex+1, len(j.Pipeline), j.Task.Name))
}

// printInfrasNotUp adds under the queue a line per infra, zone or region that does not take
// calls: why a job waits or keeps a state it cannot check is there, not in the job.
func printInfrasNotUp(out io.Writer, h api.InfraHealth, now time.Time) {
	for _, s := range h.NotUp() {
		line := fmt.Sprintf("%s is %s", s.Where(), stateLine(s, now))
		if s.LastError != "" {
			line += ": " + clip(oneLine(s.LastError), reasonRunes)
		}
		switch s.State {
		case launcher.InfraDown:
			line += "; launches skip it, and jobs with nodes there are kept as last seen until it answers."
		default:
			line += "; Ferry calls it less often until it stops asking."
		}
		fmt.Fprintln(out, line)
	}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// short renders a duration as SkyPilot's queue does: "1h 2m", "3m 4s", "5s".
func short(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d <= 0:
		return "-"
	case d < time.Minute:
		return d.String()
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
}

// details is the reason, the exit codes of a failed job, and the time lost to recoveries.
func details(j api.JobStatus) string {
	parts := []string{}
	if j.Reason != "" {
		parts = append(parts, j.Reason)
	}
	if j.State == jobs.Failed || j.State == jobs.FailedSetup {
		parts = append(parts, fmt.Sprintf("exit codes %v", j.ExitCodes))
	}
	if !j.RunUntil.IsZero() && j.State == jobs.Running {
		what := "max_run_duration stops it at "
		if j.RunLimit == "reservation" {
			what = "its reservation's end stops it at "
		}
		parts = append(parts, what+j.RunUntil.UTC().Format(time.RFC3339))
	}
	var lost time.Duration
	for _, r := range j.History {
		lost += r.Lost
	}
	if lost > 0 {
		took := short(lost)
		if lost < time.Second {
			took = "<1s" // short rounds it to nothing: "lost - to ..."
		}
		parts = append(parts, fmt.Sprintf("lost %s to %d %s", took, len(j.History), map[bool]string{true: "recovery", false: "recoveries"}[len(j.History) == 1]))
	}
	if n := len(j.LeftBehind); n > 0 {
		infras := leftoverInfras(j.LeftBehind)
		when := infras[0] + " answers again"
		if len(infras) > 1 {
			when = "each infra answers again"
		}
		parts = append(parts, fmt.Sprintf("%d left behind on %s, stopped once %s", n, strings.Join(infras, ", "), when))
	}
	return strings.Join(parts, "; ")
}

func newJobsLogsCmd() *cobra.Command {
	var follow bool
	var node int
	cmd := &cobra.Command{
		Use:   "logs ID|NAME",
		Short: "Print a job node's output (node 0 unless --node); -f follows it until the job ends",
		Example: `  ferry jobs logs 3
  ferry jobs logs finetune --node 1 -f`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			return c.JobLogs(ctx, args[0], node, follow, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the job ends (across its recoveries)")
	cmd.Flags().IntVar(&node, "node", 0, "the node's rank")
	return cmd
}

func newJobsCancelCmd() *cobra.Command {
	var all, yes, noWait bool
	var waitTime time.Duration
	cmd := &cobra.Command{
		Use:   "cancel [ID|NAME...]",
		Short: "Cancel jobs in any state that has not ended; their nodes get SIGTERM and the job's grace",
		Long: `Cancel jobs in any state that has not ended: their nodes get SIGTERM and the job's grace, then
are stopped. The command waits (up to --wait-timeout, or not at all with --no-wait) until each
job has ended, and lists what could not be stopped on an infra that did not answer: the
controller stops it once that infra answers again, after a restart too.`,
		Example: `  ferry jobs cancel 3
  ferry jobs cancel finetune nightly -y
  ferry jobs cancel -a -y --no-wait`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errors.New("name the jobs to cancel, or --all (-a) for every unfinished one")
			}
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			out := cmd.OutOrStdout()
			refs := args
			if all {
				list, err := c.Jobs(ctx)
				if err != nil {
					return err
				}
				for _, j := range list {
					if !j.State.Terminal() && j.State != jobs.Cancelling {
						refs = append(refs, strconv.FormatInt(j.ID, 10))
					}
				}
				if len(refs) == 0 {
					fmt.Fprintln(out, "No unfinished jobs.")
					return nil
				}
			}
			if !yes && term.IsTerminal(int(os.Stdin.Fd())) {
				if !confirm(cmd, fmt.Sprintf("Cancelling job(s) %s. Proceed? [Y/n] ", strings.Join(refs, ", "))) {
					return errors.New("aborted")
				}
			}
			var failed []error
			var cancelled []api.JobStatus
			for _, ref := range refs {
				st, err := c.CancelJob(ctx, ref)
				if err != nil {
					failed = append(failed, fmt.Errorf("%s: %w", ref, err))
					continue
				}
				if noWait || st.State.Terminal() {
					printCancelled(out, st)
					continue
				}
				fmt.Fprintf(out, "Job %d (%s): %s%s\n", st.ID, st.Name, st.State, because(st.Reason))
				cancelled = append(cancelled, st)
			}
			if len(cancelled) > 0 {
				failed = append(failed, waitCancelled(ctx, c, cancelled, waitTime, out))
			}
			return errors.Join(failed...)
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "cancel every unfinished job")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the jobs are cancelling, without waiting for them to end")
	cmd.Flags().DurationVar(&waitTime, "wait-timeout", defaultCancelWait, "how long to wait for the jobs to end")
	return cmd
}

// defaultCancelWait bounds how long `jobs cancel` waits for its jobs to end: a node's grace is
// at most configs.MaxGracePeriodSeconds (2 min), and stopping it takes a cloud a minute more.
const defaultCancelWait = 5 * time.Minute

// cancelPoll is how often `jobs cancel` looks at the jobs it waits for.
const cancelPoll = 250 * time.Millisecond

// waitCancelled waits until every job in sts has ended, printing each as it does, within
// timeout. Jobs still stopping then are said to go on: the cancel stands, and nothing failed.
func waitCancelled(ctx context.Context, c *api.Client, sts []api.JobStatus, timeout time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(cancelPoll)
	defer t.Stop()
	waiting := sts
	for len(waiting) > 0 {
		select {
		case <-ctx.Done():
			for _, st := range waiting {
				fmt.Fprintf(out, "Job %d (%s) is still %s; Ferry goes on stopping it (follow it with ferry jobs queue).\n", st.ID, st.Name, st.State)
			}
			return nil
		case <-t.C:
		}
		var still []api.JobStatus
		for _, st := range waiting {
			cur, err := c.Job(ctx, strconv.FormatInt(st.ID, 10))
			switch {
			case err != nil && ctx.Err() != nil:
				still = append(still, st)
			case err != nil:
				return fmt.Errorf("job %d: %w", st.ID, err)
			case cur.State.Terminal():
				printCancelled(out, cur)
			default:
				still = append(still, cur)
			}
		}
		waiting = still
	}
	return nil
}

// printCancelled says how a cancelled job ended and what of it is left on infras that did not
// answer.
func printCancelled(out io.Writer, st api.JobStatus) {
	fmt.Fprintf(out, "Job %d (%s): %s%s\n", st.ID, st.Name, st.State, because(st.Reason))
	printLeftBehind(out, st.LeftBehind)
}

// leftoverInfras are the infras that hold leftovers, by name.
func leftoverInfras(left []launcher.Leftover) []string {
	var out []string
	for _, l := range left {
		if !slices.Contains(out, l.Infra) {
			out = append(out, l.Infra)
		}
	}
	slices.Sort(out)
	return out
}

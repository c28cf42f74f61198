package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/replicas"
)

type updateFlags struct {
	mode string
	taskInput
}

func newServeUpdateCmd() *cobra.Command {
	var f updateFlags
	cmd := &cobra.Command{
		Use:   "update NAME FILE",
		Short: "Roll a service out to a new version of its task, without dropping requests",
		Long: `Start a new version of the service from FILE and move traffic to it, then follow the rollout
until it ends, printing progress.

--mode rolling (the default, or service.update.mode) launches new replicas a few at a time
(service.update.max_parallel) and retires one old replica for each new one that has stayed READY
for service.update.min_healthy_seconds; both versions serve meanwhile. --mode blue_green keeps
the old version serving alone until the new one has the whole target healthy, then switches
traffic at once. Replicas leaving stop receiving requests first and are terminated once their
requests and streams finish.

If a new replica fails before it is healthy (it crashes, or is never READY), or no new replica
becomes healthy within service.update.progress_deadline_seconds, the previous version is kept or
restored (service.update.auto_rollback, on by default) and 'ferry serve status' says why.

When only the service: section changed (policy, probes, autoscaling, auth, limits), the
running replicas are relabelled as the new version instead of being relaunched.`,
		Example: `  ferry serve update chat chat-v2.yaml
  ferry serve update chat chat-v2.yaml --mode blue_green -y
  ferry serve update chat chat.yaml --env MODEL=meta-llama/Llama-3.1-8B-Instruct --no-wait`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error { return serveUpdate(cmd, args[0], args[1], f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "mode", "", "rolling or blue_green (default: the task's service.update.mode, else rolling)")
	f.register(fl, "return once the rollout is recorded, without following it", "how long to follow the rollout", 30*time.Minute)
	return cmd
}

func serveUpdate(cmd *cobra.Command, name, file string, f updateFlags) error {
	out := cmd.OutOrStdout()
	if f.mode != "" && f.mode != configs.UpdateRolling && f.mode != configs.UpdateBlueGreen {
		return fmt.Errorf("--mode %q: want rolling or blue_green", f.mode)
	}
	task, err := f.load(file, name, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	resolved, err := task.ResolvedYAML()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "New version's spec (resolved, secrets redacted):\n%s\n", indent(string(resolved), "  "))
	printNotes(out, task.Notes)
	h, err := home.Default()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := ensureController(ctx, h, out)
	if err != nil {
		return err
	}
	if !f.yes && term.IsTerminal(int(os.Stdin.Fd())) {
		if !confirm(cmd, fmt.Sprintf("Updating service %q. Proceed? [Y/n] ", name)) {
			return errors.New("aborted")
		}
	}
	st, err := c.UpdateService(ctx, name, api.UpdateServiceRequest{Task: task, Mode: f.mode})
	if err != nil {
		return err
	}
	r := st.Update
	if r == nil {
		return errors.New("the controller accepted the update but reports no rollout")
	}
	fmt.Fprintf(out, "⚙︎ Rolling out version %d (%s, from version %d)\n", r.To, r.Mode, r.From)
	if f.noWait {
		fmt.Fprintf(out, "Follow it with 'ferry serve status %s'.\n", name)
		return nil
	}
	reconnect := func(ctx context.Context) (*api.Client, error) { return ensureController(ctx, h, out) }
	return followRollout(ctx, c, reconnect, name, r.To, f.waitTime, out)
}

// followRollout prints the rollout's progress until it ends or timeout passes.
// A controller that goes away meanwhile (killed, restarted) is found or started again through
// reconnect: the rollout is on disk and resumes there.
func followRollout(ctx context.Context, c *api.Client, reconnect func(context.Context) (*api.Client, error),
	name string, to int, timeout time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		list, err := c.Services(ctx, name)
		var apiErr *api.Error
		if err != nil && ctx.Err() == nil && !errors.As(err, &apiErr) {
			fmt.Fprintf(out, "⚙︎ Lost the controller (%v); reconnecting\n", err)
			if nc, rerr := reconnect(ctx); rerr == nil {
				c = nc
				list, err = c.Services(ctx, name)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("rollout of version %d still in progress after %s; it goes on (see 'ferry serve status %s')", to, timeout, name)
			}
			return err
		}
		r := list[0].Update
		if r == nil || r.To != to {
			return fmt.Errorf("version %d's rollout was superseded by another update", to)
		}
		line := rolloutLine(r)
		if line != last {
			fmt.Fprintf(out, "⚙︎ %s\n", line)
			last = line
		}
		switch r.State {
		case replicas.RolloutSucceeded:
			fmt.Fprintf(out, "✓ Version %d of %q is serving.\n", to, name)
			return nil
		case replicas.RolloutRolledBack:
			return fmt.Errorf("version %d failed (%s); version %d serves again", to, r.Reason, r.From)
		case replicas.RolloutFailed:
			return fmt.Errorf("version %d failed (%s) and there is no good version to roll back to; Ferry keeps retrying it", to, r.Reason)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rollout of version %d still in progress after %s; it goes on (see 'ferry serve status %s')", to, timeout, name)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// rolloutLine is a one-line account of a rollout, for update progress and serve status.
func rolloutLine(r *replicas.Rollout) string {
	switch r.State {
	case replicas.RolloutInProgress:
		s := fmt.Sprintf("%s update %d → %d: %d/%d new healthy (%d READY), %d old live", r.Mode, r.From, r.To,
			r.NewHealthy, r.Desired, r.NewReady, r.OldLive)
		if r.Mode == configs.UpdateBlueGreen {
			if r.Switched {
				s += ", traffic switched"
			} else {
				s += ", traffic on the old version"
			}
		}
		return s
	case replicas.RolloutSucceeded:
		return fmt.Sprintf("%s update %d → %d succeeded", r.Mode, r.From, r.To)
	case replicas.RolloutRolledBack:
		return fmt.Sprintf("%s update %d → %d ROLLED BACK to %d: %s", r.Mode, r.From, r.To, r.From, r.Reason)
	default:
		return fmt.Sprintf("%s update %d → %d FAILED (no version to roll back to): %s", r.Mode, r.From, r.To, r.Reason)
	}
}

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

func init() {
	register(newShowGPUsCmd)
	register(newCheckCmd)
}

// askTimeout bounds what the CLI asks of clusters (offerings, checks).
const askTimeout = 15 * time.Second

// tableRows is how many optimizer candidates `serve up` prints before "... and N more".
const tableRows = 10

func openInfras() (*infra.Set, error) {
	h, err := home.Default()
	if err != nil {
		return nil, err
	}
	// The controller's --window-lead travels as FERRY_WINDOW_LEAD when the CLI starts it; the
	// CLI's own plan (serve up's table) must leave out the same short windows.
	var errs []error
	lead := envDuration("FERRY_WINDOW_LEAD", &errs)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return infra.Open(h, infra.Options{WindowLead: lead})
}

// withInfras runs f with this machine's infras, bounding what f asks of them by askTimeout.
func withInfras(ctx context.Context, f func(context.Context, *infra.Set) error) error {
	set, err := openInfras()
	if err != nil {
		return err
	}
	defer set.Close()
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	return f(ctx, set)
}

// printPlan prints SkyPilot's optimizer table for the task: every candidate placement, best
// first, the first chosen. A task no enabled infra can run is refused here, before anything
// is launched, with the optimizer's reasons.
//
// Infras the running controller finds down (its breakers, when one runs) are neither asked nor
// planned, and a line under the table says why: planning never waits on a cloud the controller
// already knows is not answering.
func printPlan(ctx context.Context, out io.Writer, task *configs.Task) error {
	var cands []optimizer.Candidate
	var down []launcher.InfraState
	err := withInfras(ctx, func(ctx context.Context, set *infra.Set) (err error) {
		set.Provisioner.Health().Adopt(controllerBreakers(ctx))
		down = set.Down(task.Resources)
		cands, err = set.Plan(ctx, task.Resources)
		return err
	})
	if err != nil {
		return fmt.Errorf("no place to run this task: %w", err)
	}
	nodes := fmt.Sprintf("%d node%s", max(task.NumNodes, 1), plural(max(task.NumNodes, 1)))
	if task.Resources.HasShapes() {
		nodes += " unless a row's GPUS says its own gang shape; compared by what the whole gang costs"
	}
	fmt.Fprintf(out, "Considered resources (%s), best first; a launch that finds no capacity moves down the list:\n", nodes)
	if err := catalog.CheckInterruptions(); err != nil {
		fmt.Fprintf(out, "Note: %v; spot placements are ranked by the embedded traces.\n", err)
	}
	if err := optimizer.WriteObjectiveTable(out, cands, 0, tableRows, task.Resources.Objective); err != nil {
		return err
	}
	for _, s := range down {
		fmt.Fprintf(out, "Skipped %s, %s: %s (ferry check shows it).\n", s.Where(), stateLine(s, time.Now()), oneLine(s.LastError))
	}
	if err := printPlanNotes(out, task, cands); err != nil { // plannotes.go
		return err
	}
	fmt.Fprintln(out)
	return printFiles(out, task, cands)
}

// controllerBreakers are the running controller's breakers; none when no controller runs (the
// plan does not start one) or it does not answer at once.
func controllerBreakers(ctx context.Context) []launcher.InfraState {
	h, err := home.Default()
	if err != nil {
		return nil
	}
	c, _, err := connect(ctx, h)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, infraViewTimeout)
	defer cancel()
	health, err := c.Infras(ctx)
	if err != nil {
		return nil
	}
	return health.States
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func newShowGPUsCmd() *cobra.Command {
	var infraFlag string
	var reservations bool
	cmd := &cobra.Command{
		Use:   "show-gpus [NAME]",
		Short: "List the GPUs each infra offers, with prices",
		Long: `List GPU types, counts per instance and prices: the Kubernetes clusters' nodes (asked
live), and AWS and GCP from the embedded SkyPilot catalog. NAME filters by GPU name, ignoring
case ("a100" matches A100 and A100-80GB).`,
		Example: `  ferry show-gpus
  ferry show-gpus a100 --infra gcp
  ferry show-gpus --infra kubernetes
  ferry show-gpus --reservations`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reservations {
				return showReservations(cmd.Context(), cmd.OutOrStdout(), infraFlag) // reservations.go
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			return showGPUs(cmd.Context(), cmd.OutOrStdout(), infraFlag, name)
		},
	}
	cmd.Flags().StringVar(&infraFlag, "infra", "", "only this infra: kubernetes, aws or gcp")
	cmd.Flags().BoolVar(&reservations, "reservations", false, "list reservations and capacity blocks, with their windows and use")
	return cmd
}

func showGPUs(ctx context.Context, out io.Writer, which, name string) error {
	which = strings.ToLower(which)
	if which == "k8s" {
		which = "kubernetes"
	}
	if !slices.Contains([]string{"", "kubernetes", "aws", "gcp"}, which) {
		return fmt.Errorf("--infra %q: use kubernetes, aws or gcp", which)
	}
	if which == "" || which == "kubernetes" {
		err := withInfras(ctx, func(ctx context.Context, set *infra.Set) error {
			infras, errs := set.AllInfras(ctx)
			fmt.Fprintln(out, "Kubernetes GPUs")
			if len(set.Kube) == 0 {
				fmt.Fprintf(out, "  no Kubernetes context enabled (add one to %s, or create a kubeconfig)\n", infraConfigPath())
			} else if err := optimizer.WriteKubernetesGPUs(out, infras, name); err != nil {
				return err
			}
			writeSharedGPUs(ctx, out, kubeCapacities(set), name) // gpushare.go
			for _, n := range slices.Sorted(maps.Keys(errs)) {
				fmt.Fprintf(out, "  %s: %v\n", n, errs[n])
			}
			fmt.Fprintln(out)
			return nil
		})
		if err != nil {
			return err
		}
	}
	if which == "kubernetes" {
		return nil
	}
	var rows []catalog.Row
	for _, r := range catalog.Default().Rows() {
		if which == "" || r.Cloud == which {
			rows = append(rows, r)
		}
	}
	return optimizer.WriteGPUs(out, rows, name)
}

func infraConfigPath() string {
	h, err := home.Default()
	if err != nil {
		return "$FERRY_HOME/config.yaml"
	}
	return infra.ConfigPath(h)
}

func newCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Say which infras Ferry can launch on, and why not; with a controller running, how they fared",
		Long: `Check each infra: local always works; each Kubernetes context from the config (or the
kubeconfig's current context) is asked for its version and whether Ferry may list pods in its
namespace; AWS and GCP, when their sections are in the config, are asked for their zones with
the credentials of each SDK's standard chain.

When a controller is running, also show its view, read from its memory: each infra's (and
zone's or region's) breaker — up, down (calls skip it until a probe answers) or throttled —
since when, its last error, the errors counted by class, and what teardowns left behind on an
infra that did not answer, which the controller stops once it answers again. check never
starts a controller.`,
		Example: `  ferry check`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return check(cmd.Context(), cmd.OutOrStdout())
		},
	}
}

func check(ctx context.Context, out io.Writer) error {
	set, err := openInfras()
	if err != nil {
		return err
	}
	defer set.Close()
	// Last, whatever the checks found: the controller's view explains a failing infra best.
	defer printControllerView(ctx, out, time.Now())
	fmt.Fprintf(out, "Checking infras (config: %s)\n", infraConfigPath())
	fmt.Fprintln(out, "  local: enabled (replicas are processes on this machine)")
	usable := 1
	for _, k := range set.Kube {
		cctx, cancel := context.WithTimeout(ctx, askTimeout)
		err := k.Check(cctx)
		cancel()
		if err != nil {
			fmt.Fprintf(out, "  %s: disabled: %v\n", k.Infra(), err)
			continue
		}
		usable++
		fmt.Fprintf(out, "  %s: enabled (namespace %s)\n", k.Infra(), k.Namespace())
	}
	for _, n := range slices.Sorted(maps.Keys(set.Problems)) {
		fmt.Fprintf(out, "  %s: disabled: %v\n", n, set.Problems[n])
	}
	if len(set.Kube) == 0 && len(set.Problems) == 0 {
		fmt.Fprintf(out, "  kubernetes: disabled: no kubeconfig and no kubernetes section in %s\n", infraConfigPath())
	}
	enabled := map[string]bool{}
	for _, p := range set.Clouds() {
		name := p.(interface{ Infra() string }).Infra()
		enabled[name] = true
		err := errors.New("cannot check")
		if c, ok := p.(launcher.Checker); ok {
			cctx, cancel := context.WithTimeout(ctx, askTimeout)
			err = c.Check(cctx)
			cancel()
		}
		if err != nil {
			fmt.Fprintf(out, "  %s: disabled: %v\n", name, err)
			continue
		}
		usable++
		fmt.Fprintf(out, "  %s: enabled\n", name)
	}
	for _, cloud := range []string{"aws", "gcp"} {
		if !enabled[cloud] && set.Problems[cloud] == nil {
			fmt.Fprintf(out, "  %s: disabled: no %s section in %s (the optimizer still prices it: ferry show-gpus --infra %s)\n", cloud, cloud, infraConfigPath(), cloud)
		}
	}
	if usable == 0 {
		return errors.New("no usable infra")
	}
	return nil
}

// printControllerView prints the running controller's view of its infras, for `ferry check`,
// or says that none runs: check reports on this machine's settings, and must not start a
// daemon to do so.
func printControllerView(ctx context.Context, out io.Writer, now time.Time) {
	h, err := home.Default()
	if err != nil {
		return
	}
	c, st, err := connect(ctx, h)
	if err != nil {
		fmt.Fprintln(out, "\nNo controller is running: while one runs, check also shows its breakers, error counts and what teardowns left behind.")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, infraViewTimeout)
	defer cancel()
	health, err := c.Infras(ctx)
	if err != nil {
		fmt.Fprintf(out, "\nThe controller (pid %d) did not say how its infras fare: %v\n", st.PID, err)
		return
	}
	fmt.Fprintf(out, "\nThe controller's view (pid %d, up %s):\n", st.PID, humanDuration(now.Sub(st.StartedAt)))
	writeInfraHealth(out, health, now)
}

// infraViewTimeout bounds asking the controller for its view of the infras: it answers from
// memory, so a slow answer means the controller itself is in trouble.
const infraViewTimeout = 5 * time.Second

// writeInfraHealth prints the controller's breakers, error counts and leftovers.
func writeInfraHealth(out io.Writer, h api.InfraHealth, now time.Time) {
	if len(h.States) == 0 {
		fmt.Fprintln(out, "  no infra known yet")
	}
	for _, s := range h.States {
		fmt.Fprintf(out, "  %s: %s\n", s.Where(), stateLine(s, now))
		if s.LastError != "" && (s.State != launcher.InfraUp || s.Failures > 0) {
			fmt.Fprintf(out, "    last error (%s): %s\n", orDash(s.LastClass), oneLine(s.LastError))
		}
	}
	if len(h.Errors) > 0 {
		fmt.Fprintf(out, "  errors counted: %s\n", errorCounts(h.Errors))
	}
	if len(h.Leftovers) == 0 {
		fmt.Fprintln(out, "  nothing left behind")
		return
	}
	fmt.Fprintln(out, "  left behind, stopped once their infra answers again:")
	for _, l := range h.Leftovers {
		fmt.Fprintf(out, "    %s: %s (%s, for %s)\n", l.Infra, l.Describe(), cmp.Or(l.Owner, "no owner"), humanDuration(now.Sub(l.Since)))
	}
}

// stateLine says how a breaker stands: "up for 2h 3m", "down for 12s after 3 failure(s);
// next probe in 4s", "throttled for 3s; next try in 1s".
func stateLine(s launcher.InfraState, now time.Time) string {
	line := s.State
	if !s.Since.IsZero() {
		line += " for " + humanDuration(now.Sub(s.Since))
	}
	switch s.State {
	case launcher.InfraDown:
		line += fmt.Sprintf(" after %d failure%s", s.Failures, plural(s.Failures))
		if !s.RetryAt.IsZero() {
			line += "; next probe " + inOrNow(s.RetryAt.Sub(now))
		}
	case launcher.InfraThrottled:
		if !s.RetryAt.IsZero() {
			line += "; next try " + inOrNow(s.RetryAt.Sub(now))
		}
	default:
		if s.Failures > 0 {
			line += fmt.Sprintf(" (%d failure%s in a row)", s.Failures, plural(s.Failures))
		}
	}
	return line
}

func inOrNow(d time.Duration) string {
	if d <= 0 {
		return "now"
	}
	return "in " + humanDuration(d)
}

// errorCounts renders counts by infra then class: "aws: throttled 1; gcp: not_found 3, unavailable 12".
func errorCounts(errs []api.InfraErrors) string {
	var parts []string
	for i := 0; i < len(errs); {
		infra := errs[i].Infra
		var classes []string
		for ; i < len(errs) && errs[i].Infra == infra; i++ {
			classes = append(classes, fmt.Sprintf("%s %d", errs[i].Class, errs[i].Count))
		}
		parts = append(parts, infra+": "+strings.Join(classes, ", "))
	}
	return strings.Join(parts, "; ")
}

// printLeftBehind says what a teardown could not stop, infra by infra, and that the
// controller stops it once that infra answers again: the command succeeded for the rest.
func printLeftBehind(out io.Writer, left []launcher.Leftover) {
	if len(left) == 0 {
		return
	}
	byInfra := map[string][]launcher.Leftover{}
	for _, l := range left {
		byInfra[l.Infra] = append(byInfra[l.Infra], l)
	}
	infras := slices.Sorted(maps.Keys(byInfra))
	for _, infra := range infras {
		ls := byInfra[infra]
		reason := ""
		if ls[0].Reason != "" {
			reason = " (" + clip(oneLine(ls[0].Reason), reasonRunes) + ")"
		}
		fmt.Fprintf(out, "  Left on %s, which did not answer%s:\n", infra, reason)
		for _, l := range ls {
			fmt.Fprintf(out, "    %s\n", l.Describe())
		}
	}
	what := "them"
	if len(left) == 1 {
		what = "it"
	}
	fmt.Fprintf(out, "  Ferry stops %s when %s answers again, after a controller restart too; 'ferry check' shows what is still left.\n",
		what, strings.Join(infras, " or "))
}

// reasonRunes is how much of an infra's error a line about what it holds repeats: enough to
// tell a refused connection from a throttle; `ferry check` prints it whole.
const reasonRunes = 200

// oneLine joins the lines of an error (errors.Join puts one per failing zone) with "; ", so
// that it reads on one line or in a table cell.
func oneLine(s string) string {
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ")
}

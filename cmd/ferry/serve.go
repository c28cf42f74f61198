package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/privnet"
	"github.com/ferryserve/ferry/replicas"
)

func init() { register(newServeCmd) }

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Launch, inspect and tear down services",
		Example: `  ferry serve up configs/examples/quickstart.yaml -y
  ferry serve status -v
  ferry serve update quickstart quickstart-v2.yaml
  ferry serve logs quickstart 1 --follow
  ferry serve down quickstart -y`,
	}
	cmd.AddCommand(newServeUpCmd(), newServeUpdateCmd(), newServeStatusCmd(), newServeLogsCmd(), newServeDownCmd())
	return cmd
}

type upFlags struct {
	name   string
	dryRun bool
	taskInput
}

// taskInput is what serve up and serve update share: the --env and --secret values a task is
// loaded with, confirmation and waiting.
type taskInput struct {
	envs     []string
	secrets  []string
	yes      bool
	noWait   bool
	waitTime time.Duration
}

// register adds the shared flags; noWait and wait say what is waited for.
func (t *taskInput) register(fl *pflag.FlagSet, noWait, wait string, waitDefault time.Duration) {
	fl.StringArrayVar(&t.envs, "env", nil, "set an env var for setup and run, K=V (repeatable; K alone takes it from your environment)")
	fl.StringArrayVar(&t.secrets, "secret", nil, "set a secret env var, K=V (repeatable; K alone takes it from your environment); never shown")
	fl.BoolVarP(&t.yes, "yes", "y", false, "do not ask for confirmation")
	fl.BoolVar(&t.noWait, "no-wait", false, noWait)
	fl.DurationVar(&t.waitTime, "wait-timeout", waitDefault, wait)
}

// load reads and validates a service's task file with the --env and --secret values; YAML
// errors are printed to errOut, each with its line.
func (t *taskInput) load(file, name string, errOut io.Writer) (*configs.Task, error) {
	task, err := t.loadTask(file, name, errOut)
	if err != nil {
		return nil, err
	}
	if task.Service == nil {
		return nil, fmt.Errorf("%s has no service: section; a service needs one (see configs/examples/quickstart.yaml), and a task without one is a job: ferry jobs launch %s", file, file)
	}
	return task, nil
}

// loadTask reads and validates any task file, service or job.
func (t *taskInput) loadTask(file, name string, errOut io.Writer) (*configs.Task, error) {
	ov, err := t.overrides(name)
	if err != nil {
		return nil, err
	}
	task, err := configs.Load(file, ov)
	if err != nil {
		printConfigErrors(errOut, err)
		return nil, errors.New("the task YAML has errors; nothing was launched or changed")
	}
	return task, resolveFiles(task)
}

// loadPipeline is loadTask for a job's file, which may hold a pipeline of tasks.
func (t *taskInput) loadPipeline(file, name string, errOut io.Writer) (*configs.Pipeline, error) {
	ov, err := t.overrides(name)
	if err != nil {
		return nil, err
	}
	p, err := configs.LoadPipeline(file, ov)
	if err != nil {
		printConfigErrors(errOut, err)
		return nil, errors.New("the task YAML has errors; nothing was launched or changed")
	}
	for _, task := range p.Tasks {
		if err := resolveFiles(task); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (t *taskInput) overrides(name string) (configs.Overrides, error) {
	envs, err := parseKVs("env", t.envs)
	if err != nil {
		return configs.Overrides{}, err
	}
	secrets, err := parseKVs("secret", t.secrets)
	if err != nil {
		return configs.Overrides{}, err
	}
	return configs.Overrides{Envs: envs, Secrets: secrets, Name: name}, nil
}

// resolveFiles makes task's workdir and local file_mounts absolute: they are relative to
// where the CLI runs, as in SkyPilot.
func resolveFiles(task *configs.Task) error {
	cwd, _ := os.Getwd()
	home, _ := os.UserHomeDir()
	if err := configs.ResolveFiles(task, cwd, home); err != nil {
		return fmt.Errorf("%w\nnothing was launched or changed", err)
	}
	return nil
}

func newServeUpCmd() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up FILE",
		Short: "Launch a service from a task YAML and print its endpoint",
		Long: `Validate the task YAML, show the resolved spec and the placement plan, start the service and
wait until its replicas are READY, printing progress. The endpoint is OpenAI-compatible.`,
		Example: `  ferry serve up configs/examples/quickstart.yaml -y
  ferry serve up vllm.yaml -n chat --env MODEL=meta-llama/Llama-3.1-8B-Instruct --secret HF_TOKEN=hf_xxx
  ferry serve up vllm.yaml --dry-run`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return serveUp(cmd, args[0], f) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.name, "name", "n", "", "service name (default: the task's name, else one is generated)")
	f.register(fl, "return once the service is registered, without waiting for READY replicas",
		"how long to wait for all replicas to be READY", 10*time.Minute)
	fl.BoolVar(&f.dryRun, "dry-run", false, "validate and print the plan without launching")
	return cmd
}

func parseKVs(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, kv)
		}
		if !ok {
			val, found := os.LookupEnv(k)
			if !found {
				return nil, fmt.Errorf("--%s %s: no value given and %s is not set in your environment", flag, k, k)
			}
			v = val
		}
		out[k] = v
	}
	return out, nil
}

func serveUp(cmd *cobra.Command, file string, f upFlags) error {
	out := cmd.OutOrStdout()
	task, err := f.load(file, f.name, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	name := task.Name
	if name == "" {
		name = "service-" + randomHex(2)
	}

	if proceed, err := reviewLaunch(cmd, task, "service", name, f.dryRun, f.yes); !proceed {
		return err
	}
	ctx, stop, c, err := controllerFor(cmd, out)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Fprintf(out, "⚙︎ Launching service %q...\n", name)
	st, err := c.CreateService(ctx, api.CreateServiceRequest{Name: name, Task: task})
	if err != nil {
		return err
	}
	if f.noWait {
		fmt.Fprintf(out, "⚙︎ Service registered; endpoint %s; %d replica(s) to launch\n", st.Endpoint, st.TargetReplicas)
		fmt.Fprintf(out, "\nService %q is registered; its replicas are starting ('ferry serve status %s' follows them).\nEndpoint: %s\n", name, name, st.Endpoint)
	} else {
		fmt.Fprintf(out, "⚙︎ Service registered; endpoint %s; waiting for %d replica(s)\n", st.Endpoint, st.TargetReplicas)
		if err := waitReady(ctx, c, name, f.waitTime, out); err != nil {
			fmt.Fprintf(out, "The service keeps trying; follow it with 'ferry serve status %s' and 'ferry serve logs %s REPLICA_ID'.\n", name, name)
			return err
		}
		fmt.Fprintf(out, "\nService %q is up.\nEndpoint: %s\n", name, st.Endpoint)
		printLoopbackNote(ctx, c, name, out)
	}
	if cs, err := c.ControllerStatus(ctx); err == nil {
		if cs.Gateway != "" {
			fmt.Fprintf(out, "Gateway:  %s (one endpoint for every service; the request's \"model\" picks it)\n", cs.Gateway)
		}
		if cs.Metrics != "" {
			fmt.Fprintf(out, "Metrics:  %s (Prometheus)\n", cs.Metrics)
		}
	}
	// With service.auth the example must send a key; name the variable the user keeps it in.
	authHeader, authArg := "", ""
	if a := task.Service.Auth; a != nil {
		keyVar := "FERRY_API_KEY"
		if len(a.KeysFromEnv) > 0 {
			keyVar = a.KeysFromEnv[0]
		}
		authHeader = "Bearer " + os.Getenv(keyVar)
		authArg = fmt.Sprintf(" -H \"Authorization: Bearer $%s\"", keyVar)
	}
	// --no-wait asks nothing of the endpoint: it holds a request until a replica is READY (up
	// to servedModel's 3 s), and the replica a service at zero would launch for it is load.
	model, zero := "MODEL", st.TargetReplicas == 0
	if !f.noWait {
		model, zero = exampleModel(ctx, c, name, st.Endpoint, authHeader) // servezero.go
	}
	if zero {
		fmt.Fprintf(out, "No replica runs yet (min_replicas: 0): the first request launches one and waits for it.\n")
	}
	fmt.Fprintf(out, "\nTry it:\n  curl%s %s/v1/models\n", authArg, st.Endpoint)
	fmt.Fprintf(out, "  curl %s/v1/chat/completions%s -H 'Content-Type: application/json' \\\n    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'\n",
		st.Endpoint, authArg, model)
	fmt.Fprintf(out, "  ferry serve status %s\n  ferry serve down %s\n", name, name)
	return nil
}

// reviewLaunch shows what launching task will do (the resolved spec, secrets redacted, and the
// optimizer's table) and asks to proceed on a terminal unless yes; kind names it ("service",
// "managed job"). proceed is false after a dry run (err nil) or a refusal (err set).
func reviewLaunch(cmd *cobra.Command, task *configs.Task, kind, name string, dryRun, yes bool) (proceed bool, err error) {
	return reviewTasks(cmd, []*configs.Task{task}, kind, name, dryRun, yes)
}

// reviewTasks is reviewLaunch for the tasks of a pipeline: each one's spec and plan, headed
// "Task i/n" when there are several, then one confirmation.
func reviewTasks(cmd *cobra.Command, tasks []*configs.Task, kind, name string, dryRun, yes bool) (proceed bool, err error) {
	out := cmd.OutOrStdout()
	spec := kind
	if i := strings.LastIndexByte(kind, ' '); i >= 0 {
		spec = kind[i+1:]
	}
	for i, task := range tasks {
		if len(tasks) > 1 {
			fmt.Fprintf(out, "Task %d/%d %q of pipeline %q, run after the one before it succeeds:\n", i+1, len(tasks), task.Name, name)
		}
		resolved, err := task.ResolvedYAML()
		if err != nil {
			return false, err
		}
		fmt.Fprintf(out, "%s spec (resolved, secrets redacted):\n%s\n", strings.ToUpper(spec[:1])+spec[1:], indent(string(resolved), "  "))
		printNotes(out, task.Notes)
		if err := printPlan(cmd.Context(), out, task); err != nil {
			return false, err
		}
		if pool := task.PoolTask(configs.PoolPrefill); pool != nil && task.Service.Pools.Prefill.Resources != nil {
			// Resources of its own: the prefill pool is placed on its own plan.
			fmt.Fprintln(out, "The prefill pool (service.pools.prefill):")
			if err := printPlan(cmd.Context(), out, pool); err != nil {
				return false, fmt.Errorf("the prefill pool: %w", err)
			}
		}
	}
	if dryRun {
		fmt.Fprintf(out, "Dry run: %s %q is valid; nothing was launched.\n", spec, name)
		return false, nil
	}
	if !yes && term.IsTerminal(int(os.Stdin.Fd())) && !confirm(cmd, fmt.Sprintf("Launching %s %q. Proceed? [Y/n] ", kind, name)) {
		return false, errors.New("aborted")
	}
	return true, nil
}

// printLoopbackNote says when a local replica of the service listens on loopback, where every
// user of the host reaches it past the service's API keys, rather than in Ferry's private
// network (launcher/privnet): the controller's log says why.
func printLoopbackNote(ctx context.Context, c *api.Client, name string, out io.Writer) {
	list, err := c.Services(ctx, name)
	if err != nil || len(list) != 1 {
		return
	}
	for _, r := range list[0].Replicas {
		if privnet.OpenToLocalUsers(r.Endpoint) {
			why := "see \"local replicas listen on loopback\" in controller.log for why; a replica of several nodes always does"
			if runtime.GOOS != "linux" {
				why = "Ferry's private network for local replicas needs Linux"
			}
			fmt.Fprintf(out, "Note: replica %d listens on loopback at %s, where every user of this host can send it requests "+
				"past the service's API keys (%s).\n", r.ID, r.Endpoint, why)
			return
		}
	}
}

// printNotes says what Ferry accepted in the task file but reads its own way (a deprecated
// spelling, alternatives on clouds it lacks dropped, a name made DNS-safe), each with its place
// in the file, so that a plan never does something other than what the file says silently.
func printNotes(out io.Writer, notes []configs.Note) {
	for _, n := range notes {
		fmt.Fprintf(out, "Note: %s\n", n)
	}
	if len(notes) > 0 {
		fmt.Fprintln(out)
	}
}

// controllerFor returns a client for this home's controller, started if none runs, and a
// context that ends at Ctrl-C or SIGTERM (stop releases it).
func controllerFor(cmd *cobra.Command, progress io.Writer) (ctx context.Context, stop func(), c *api.Client, err error) {
	h, err := home.Default()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, stop = signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	if c, err = ensureController(ctx, h, progress); err != nil {
		stop()
		return nil, nil, nil, err
	}
	return ctx, stop, c, nil
}

// servedModel asks the endpoint which model it serves, so the printed example works as is.
func servedModel(ctx context.Context, endpoint, authorization string) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/v1/models", nil)
	if err != nil {
		return "MODEL"
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "MODEL"
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list) != nil || len(list.Data) == 0 {
		return "MODEL"
	}
	return list.Data[0].ID
}

// waitReady prints each change in the replica counts until every wanted replica is READY.
func waitReady(ctx context.Context, c *api.Client, name string, timeout time.Duration, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		list, err := c.Services(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("replicas not all READY after %s", timeout)
			}
			return err
		}
		st := list[0]
		line := fmt.Sprintf("Replicas: %d/%d READY%s", st.ReadyReplicas, st.TargetReplicas, stateCounts(st.Replicas))
		if line != last {
			mark := "⚙︎"
			if st.ReadyReplicas >= st.TargetReplicas {
				mark = "✓"
			}
			fmt.Fprintf(out, "%s %s\n", mark, line)
			last = line
		}
		if st.ReadyReplicas >= st.TargetReplicas {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replicas not all READY after %s", timeout)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// stateCounts renders the non-READY, non-terminal states, e.g. " [1 STARTING, 1 PROVISIONING]".
func stateCounts(recs []replicas.Record) string {
	counts := map[replicas.Status]int{}
	for _, r := range recs {
		if r.Status != replicas.StatusReady && !r.Status.Terminal() {
			counts[r.Status]++
		}
	}
	if len(counts) == 0 {
		return ""
	}
	var parts []string
	for s, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, s))
	}
	sort.Strings(parts)
	return " [" + strings.Join(parts, ", ") + "]"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printConfigErrors(w io.Writer, err error) {
	errs := configs.Errors(err)
	if len(errs) == 0 {
		fmt.Fprintln(w, "error:", err)
		return
	}
	for _, e := range errs {
		fmt.Fprintln(w, e.Error())
	}
}

func confirm(cmd *cobra.Command, prompt string) bool {
	fmt.Fprint(cmd.OutOrStdout(), prompt)
	line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
	line = strings.ToLower(strings.TrimSpace(line))
	return line == "" || line == "y" || line == "yes"
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

func newServeStatusCmd() *cobra.Command {
	var verbose, endpoint, asJSON bool
	cmd := &cobra.Command{
		Use:   "status [NAMES...]",
		Short: "Show services and their replicas",
		Example: `  ferry serve status
  ferry serve status quickstart -v
  ferry serve status quickstart --endpoint
  ferry serve status --json | jq '.[0].replicas'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := home.Default()
			if err != nil {
				return err
			}
			c, err := ensureController(cmd.Context(), h, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			list, err := c.Services(cmd.Context(), args...)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if endpoint {
				if len(list) != 1 {
					return fmt.Errorf("--endpoint needs exactly one service (there are %d)", len(list))
				}
				fmt.Fprintln(out, list[0].Endpoint)
				return nil
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			printStatus(out, list, verbose, time.Now())
			return nil
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "show failed replicas, reasons, the load-balancing policy, the spot losses that hold the on-demand fallback and the health of the replicas' infras")
	cmd.Flags().BoolVar(&endpoint, "endpoint", false, "print only the endpoint of the one named service")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the services as JSON (secrets redacted), for scripts")
	return cmd
}

// printStatus prints SkyServe's two tables.
func printStatus(out io.Writer, list []api.ServiceStatus, verbose bool, now time.Time) {
	fmt.Fprintln(out, "Services")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	hdr := "NAME\tVERSION\tUPTIME\tSTATUS\tREPLICAS\tCOST ($/hr)\tENDPOINT"
	if verbose {
		hdr += "\tPOLICY\tAUTOSCALER"
	}
	fmt.Fprintln(tw, hdr)
	for _, s := range list {
		line := fmt.Sprintf("%s\t%d\t%s\t%s\t%d/%d\t%.2f\t%s", s.Name, s.Version, humanDuration(now.Sub(s.CreatedAt)), s.Status,
			s.ReadyReplicas, s.TargetReplicas, serviceCost(s.Replicas), s.Endpoint)
		if verbose {
			line += "\t" + s.Policy + "\t" + cmp.Or(s.Autoscaler, "fixed")
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	for _, s := range list {
		if p := s.Prefill; p != nil {
			line := fmt.Sprintf("%s: %s pool %d/%d READY, %.2f $/hr", s.Name, p.Name, p.ReadyReplicas, p.TargetReplicas, serviceCost(p.Replicas))
			if verbose && p.Scaling != "" {
				line += ": " + p.Scaling
			}
			fmt.Fprintln(out, line)
		}
		if s.Update != nil && (verbose || s.Update.State != replicas.RolloutSucceeded || now.Sub(s.Update.FinishedAt) < time.Hour) {
			fmt.Fprintf(out, "%s: %s\n", s.Name, rolloutLine(s.Update))
		}
	}
	if verbose {
		for _, s := range list {
			printServiceDecisions(out, s, now)
		}
	}
	if len(list) == 0 {
		fmt.Fprintln(out, "No services. Launch one with 'ferry serve up FILE'.")
		return
	}
	fmt.Fprintln(out, "\nService Replicas")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	hdr = "SERVICE_NAME\tID\tVERSION\tENDPOINT\tLAUNCHED\tINFRA\tZONE\tKIND\t$/hr\tRESOURCES\tSTATUS"
	if verbose {
		hdr += "\tREASON"
	}
	fmt.Fprintln(tw, hdr)
	for _, s := range list {
		printReplicaRows(tw, s, s.Name, s.Replicas, verbose, now)
		if p := s.Prefill; p != nil {
			printReplicaRows(tw, s, s.Name+"/"+p.Name, p.Replicas, verbose, now)
		}
	}
	tw.Flush()
	for _, s := range list {
		printUnknown(out, s, verbose)
	}
	if verbose {
		printServiceInfras(out, list, now)
	}
}

// printReplicaRows writes one row per replica of recs, a pool of service s named name.
func printReplicaRows(tw io.Writer, s api.ServiceStatus, name string, recs []replicas.Record, verbose bool, now time.Time) {
	for _, r := range recs {
		if r.Status.Terminal() && !verbose {
			continue
		}
		launched := "-"
		if !r.LaunchedAt.IsZero() {
			launched = humanDuration(now.Sub(r.LaunchedAt)) + " ago"
		}
		ep := "-"
		if r.Endpoint != "" {
			ep = "http://" + r.Endpoint
		}
		kind := "on-demand"
		if r.Spot {
			kind = "spot"
		}
		line := fmt.Sprintf("%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s", name, r.ID, r.Version, ep, launched,
			orDash(r.Infra), orDash(r.Zone), kind, r.Price, orDash(r.Resources), r.Status)
		if verbose {
			reason := r.Reason
			if g, unknown := unknownPart(s.Unknown, r); unknown {
				reason = strings.TrimSuffix("instance unknown: "+g.Gap().Where()+" did not answer; "+reason, "; ")
			}
			line += "\t" + orDash(reason)
		}
		fmt.Fprintln(tw, line)
	}
}

// printServiceDecisions shows, for -v, why the service runs what it runs: the reason for its
// target, and the spot losses that hold its on-demand fallback.
func printServiceDecisions(out io.Writer, s api.ServiceStatus, now time.Time) {
	if s.Scaling != "" {
		fmt.Fprintf(out, "%s: target %d: %s\n", s.Name, s.TargetReplicas, s.Scaling)
	}
	l := s.SpotLosses
	if l == nil {
		return
	}
	total := 0
	for _, z := range l.Zones {
		total += z.Count
	}
	line := fmt.Sprintf("%s: spot losses: %d (last %s, %d recent gap%s", s.Name, total, timeOfDay(l.Last, now), l.RecentGaps, plural(l.RecentGaps))
	switch {
	case l.Last.IsZero():
		line = fmt.Sprintf("%s: spot losses: none", s.Name)
	case !l.HeldUntil.IsZero():
		line += fmt.Sprintf(", hold %s: on-demand fallback held until %s)", humanDuration(l.Hold), timeOfDay(l.HeldUntil, now))
	case l.Hold > 0:
		line += fmt.Sprintf(", hold %s: ended %s)", humanDuration(l.Hold), timeOfDay(l.Last.Add(l.Hold), now))
	default:
		line += ": not a run, nothing held)"
	}
	fmt.Fprintln(out, line)
	for _, zone := range slices.Sorted(maps.Keys(l.Zones)) {
		z := l.Zones[zone]
		line := fmt.Sprintf("  %s: %d lost", zone, z.Count)
		if z.Count > 0 {
			line += ", last " + timeOfDay(z.Last, now)
		}
		if z.Ceiling > 0 {
			// What the spare reads (policy.Losses.Spare): the zone held no more than this.
			line += fmt.Sprintf("; held at most %d spot replica%s at %s", z.Ceiling, plural(z.Ceiling), timeOfDay(z.CeilingAt, now))
		}
		fmt.Fprintln(out, line)
	}
	if l.Spare > 0 {
		fmt.Fprintf(out, "%s: spare: %d spot replica beyond the target, while a zone holds as many as its ceiling\n", s.Name, l.Spare)
	}
}

// timeOfDay is t as a time of day, with the date when it is not within the day before now (UTC).
func timeOfDay(t, now time.Time) string {
	if now.Sub(t) < 24*time.Hour {
		return t.UTC().Format("15:04:05")
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

// unknownPart is the part of an infra the service could not list that holds r, when r holds
// an instance: r's status is then as last seen, not as the infra has it now.
func unknownPart(parts []api.UnknownPart, r replicas.Record) (api.UnknownPart, bool) {
	if r.InstanceID == "" || r.Status.Terminal() {
		return api.UnknownPart{}, false
	}
	for _, p := range parts {
		if p.Gap().Covers(r.Infra, "", r.Zone) {
			return p, true
		}
	}
	return api.UnknownPart{}, false
}

// printUnknown says which replicas' instances are unknown because their infra did not answer
// the service's last listing: they are kept as last seen, neither replaced nor counted gone.
// Parts that hold none of the service's replicas are mentioned with -v only.
func printUnknown(out io.Writer, s api.ServiceStatus, verbose bool) {
	for _, p := range s.Unknown {
		var ids []string
		for _, r := range s.Replicas {
			if _, in := unknownPart([]api.UnknownPart{p}, r); in {
				ids = append(ids, strconv.Itoa(r.ID))
			}
		}
		reason := ""
		if p.Reason != "" {
			reason = " (" + clip(oneLine(p.Reason), reasonRunes) + ")"
		}
		switch {
		case len(ids) == 1:
			fmt.Fprintf(out, "%s: %s did not answer the last listing%s: replica %s there is kept as last seen; its instance is unknown, not gone.\n",
				s.Name, p.Gap().Where(), reason, ids[0])
		case len(ids) > 1:
			fmt.Fprintf(out, "%s: %s did not answer the last listing%s: replicas %s there are kept as last seen; their instances are unknown, not gone.\n",
				s.Name, p.Gap().Where(), reason, strings.Join(ids, ", "))
		case verbose:
			fmt.Fprintf(out, "%s: %s did not answer the last listing%s; none of its replicas is there.\n", s.Name, p.Gap().Where(), reason)
		}
	}
}

// printServiceInfras shows, for -v, the breakers of the infras each service's replicas are on
// (and of those its listing could not read), from the controller's memory.
func printServiceInfras(out io.Writer, list []api.ServiceStatus, now time.Time) {
	if !slices.ContainsFunc(list, func(s api.ServiceStatus) bool { return len(s.Infras) > 0 }) {
		return
	}
	fmt.Fprintln(out, "\nInfras of the replicas")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE_NAME\tINFRA\tSTATE\tLAST ERROR")
	for _, s := range list {
		for _, st := range s.Infras {
			lastErr := "-"
			if st.LastError != "" && (st.State != launcher.InfraUp || st.Failures > 0) {
				lastErr = clip(oneLine(st.LastError), 100)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, st.Where(), stateLine(st, now), lastErr)
		}
	}
	tw.Flush()
}

// clip shortens s to n runes for a table cell.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// serviceCost is what a service's replicas cost per hour now: every replica that holds an
// instance (serving, starting or draining), at the price it was launched at.
func serviceCost(recs []replicas.Record) float64 {
	var sum float64
	for _, r := range recs {
		if !r.Status.Terminal() && r.InstanceID != "" {
			sum += r.Price
		}
	}
	return sum
}

func humanDuration(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

func newServeLogsCmd() *cobra.Command {
	var (
		follow, ctrl bool
		tail         int
	)
	cmd := &cobra.Command{
		Use:   "logs NAME [REPLICA_ID]",
		Short: "Print a replica's output (setup and run) on any infra, or the controller's log",
		Long: `Print a replica's output: a local replica's output file, a Kubernetes pod's log (through the
API server), an AWS or GCP VM's console output; or, with --controller, the controller's log.
--follow keeps printing until the replica ends (fails, is replaced or scaled down, or the
service goes down) or you interrupt it.`,
		Example: `  ferry serve logs quickstart 1
  ferry serve logs quickstart 2 --follow --tail 20
  ferry serve logs quickstart --controller`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && !ctrl {
				return errors.New("give a REPLICA_ID (see 'ferry serve status " + args[0] + "') or --controller")
			}
			h, err := home.Default()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			c, err := ensureController(ctx, h, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			opts := api.LogOptions{Tail: tail, Follow: follow}
			if ctrl {
				if _, err := c.Services(ctx, args[0]); err != nil {
					return err
				}
				return c.ControllerLogs(ctx, opts, cmd.OutOrStdout())
			}
			id, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("REPLICA_ID %q is not a number", args[1])
			}
			return c.ReplicaLogs(ctx, args[0], id, opts, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new output until the replica ends")
	cmd.Flags().IntVar(&tail, "tail", -1, "print only the last N lines (default: all)")
	cmd.Flags().BoolVar(&ctrl, "controller", false, "print the controller's log instead of a replica's")
	return cmd
}

// tearDownParallel is how many services serve down takes down at once. Each waits on its own
// drain and on its replicas' termination, seconds on Kubernetes, so a hundred one after the
// other took minutes; the controller takes services down independently.
const tearDownParallel = 32

// tearDown takes the named services down, tearDownParallel at a time, and reports each as it
// goes.
func tearDown(ctx context.Context, c *api.Client, out io.Writer, names []string) error {
	var (
		mu   sync.Mutex
		errs = make([]error, len(names))
		wg   sync.WaitGroup
		sem  = make(chan struct{}, tearDownParallel)
	)
	for i, n := range names {
		sem <- struct{}{}
		mu.Lock()
		fmt.Fprintf(out, "⚙︎ Tearing down %q (draining, then terminating replicas)...\n", n)
		mu.Unlock()
		wg.Go(func() {
			defer func() { <-sem }()
			res, err := c.DeleteService(ctx, n)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("%s: %w", n, err)
			case len(res.LeftBehind) == 0:
				fmt.Fprintf(out, "✓ Service %q is down.\n", n)
			default:
				fmt.Fprintf(out, "✓ Service %q is down, except what could not be reached:\n", n)
				printLeftBehind(out, res.LeftBehind)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func newServeDownCmd() *cobra.Command {
	var all, yes bool
	cmd := &cobra.Command{
		Use:   "down [NAMES...]",
		Short: "Tear services down: drain their endpoints, terminate every replica, forget them",
		Long: `Tear services down: drain their endpoints, terminate every replica and forget them. An infra
that does not answer (down, throttling, hung) does not hold the rest up: what Ferry could not
stop there is listed — instance ids, or for an infra that could not even be listed, every
instance of the service there launched before the teardown — and the controller stops it once
that infra answers again, after a restart too. The command succeeds all the same.`,
		Example: `  ferry serve down quickstart -y
  ferry serve down -a -y`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errors.New("name the services to tear down, or pass -a for all of them")
			}
			h, err := home.Default()
			if err != nil {
				return err
			}
			c, err := ensureController(cmd.Context(), h, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			names := args
			if all {
				list, err := c.Services(cmd.Context())
				if err != nil {
					return err
				}
				names = nil
				for _, s := range list {
					names = append(names, s.Name)
				}
				if len(names) == 0 {
					fmt.Fprintln(out, "No services to tear down.")
					return nil
				}
			} else if _, err := c.Services(cmd.Context(), names...); err != nil {
				return err
			}
			if !yes && term.IsTerminal(int(os.Stdin.Fd())) {
				if !confirm(cmd, fmt.Sprintf("Tearing down %s. Proceed? [Y/n] ", strings.Join(names, ", "))) {
					return errors.New("aborted")
				}
			}
			return tearDown(cmd.Context(), c, out, names)
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "tear down every service")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return cmd
}

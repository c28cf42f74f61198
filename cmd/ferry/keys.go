package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/tenants"
)

func init() { register(newKeysCmd) }

func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Create, list, limit and revoke the API keys of the endpoints (one gateway, many tenants)",
		Long: `API keys say who may call the services' endpoints and how much. Each key has an id, a name,
an optional team, a scope (services and models; all when none), an expiry, a priority class
(interactive, standard, batch) and limits in requests and tokens per minute and per day and in
dollars per day, month or ever. A team's limits hold for its keys together, on top of each
key's. Dollars come from per-model prices (ferry keys prices). Limits hold across every proxy of
the fleet. The controller keeps each key's hash, never its secret: create shows the secret once.`,
		Example: `  ferry keys create alice --team research --service chat --rpm 60 --tpd 2000000
  ferry keys list
  ferry keys update alice --budget-usd 50 --budget-period month
  ferry keys revoke alice
  ferry keys teams set research --rpd 100000
  ferry keys prices set meta-llama/Llama-3.1-8B-Instruct --input-per-million 0.05 --output-per-million 0.08`,
	}
	cmd.AddCommand(newKeysCreateCmd(), newKeysListCmd(), newKeysRevokeCmd(), newKeysUpdateCmd(), newKeysTeamsCmd(), newKeysPricesCmd())
	return cmd
}

// limitFlags are the flags of a key's or a team's limits; only those given are sent.
type limitFlags struct {
	counts map[string]*int64
	budget float64
	period string
}

// limitFlagNames map each count flag to its help.
var limitFlagNames = []struct{ name, help string }{
	{"rpm", "requests per minute"}, {"rpd", "requests per day (UTC)"},
	{"input-tpm", "input (prompt) tokens per minute"}, {"input-tpd", "input tokens per day"},
	{"output-tpm", "output (generated) tokens per minute"}, {"output-tpd", "output tokens per day"},
	{"tpm", "input and output tokens per minute"}, {"tpd", "input and output tokens per day"},
}

func addLimitFlags(fs *pflag.FlagSet) *limitFlags {
	f := &limitFlags{counts: map[string]*int64{}}
	for _, l := range limitFlagNames {
		f.counts[l.name] = fs.Int64(l.name, 0, l.help+" (0: no limit)")
	}
	fs.Float64Var(&f.budget, "budget-usd", 0, "dollars the key or team may spend per --budget-period, priced by ferry keys prices (0: no budget)")
	fs.StringVar(&f.period, "budget-period", "", "what the budget renews with: day, month (the default) or total")
	return f
}

// patch is the limits given on the command line.
func (f *limitFlags) patch(fs *pflag.FlagSet) api.LimitsPatch {
	var p api.LimitsPatch
	dst := map[string]**int64{"rpm": &p.RequestsPerMinute, "rpd": &p.RequestsPerDay, "input-tpm": &p.InputTokensPerMinute,
		"input-tpd": &p.InputTokensPerDay, "output-tpm": &p.OutputTokensPerMinute, "output-tpd": &p.OutputTokensPerDay,
		"tpm": &p.TotalTokensPerMinute, "tpd": &p.TotalTokensPerDay}
	for name, v := range f.counts {
		if fs.Changed(name) {
			*dst[name] = v
		}
	}
	if fs.Changed("budget-usd") {
		p.BudgetUSD = &f.budget
	}
	if fs.Changed("budget-period") {
		period := tenants.Period(f.period)
		p.BudgetPeriod = &period
	}
	return p
}

// keyFlags are create's and update's flags besides the limits.
type keyFlags struct {
	team           string
	services       []string
	models         []string
	expires        string
	priority       string
	priorityHeader bool
	limits         *limitFlags
}

func addKeyFlags(fs *pflag.FlagSet) *keyFlags {
	f := &keyFlags{}
	fs.StringVar(&f.team, "team", "", "the key's team, whose limits it shares")
	fs.StringSliceVar(&f.services, "service", nil, "a service the key may call (repeat or comma-separate; none: every service)")
	fs.StringSliceVar(&f.models, "model", nil, "a model the key may ask for (repeat or comma-separate; none: every model)")
	fs.StringVar(&f.expires, "expires", "", "when the key stops working: a duration (720h, 30d), a day (2026-12-31, at 00:00 UTC) or RFC 3339 time")
	fs.StringVar(&f.priority, "priority", "", "the class of the key's requests when replicas are saturated: interactive, standard or batch")
	fs.BoolVar(&f.priorityHeader, "priority-header", false, "let requests lower their class with the x-ferry-priority header")
	f.limits = addLimitFlags(fs)
	return f
}

// parseExpiry reads --expires: a duration from now (Go's, or N days as "30d"), a day (00:00
// UTC) or an RFC 3339 time; "never" is the zero time.
func parseExpiry(s string, now time.Time) (time.Time, error) {
	if s == "never" {
		return time.Time{}, nil
	}
	if n, ok := strings.CutSuffix(s, "d"); ok {
		if days, err := strconv.Atoi(n); err == nil && days > 0 {
			return now.Add(time.Duration(days) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(d), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--expires %q: want a duration (720h, 30d), a day (2026-12-31) or an RFC 3339 time", s)
}

func newKeysCreateCmd() *cobra.Command {
	var asJSON bool
	var f *keyFlags
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an API key and show its secret, this once",
		Long: `Create a key named NAME (letters, digits, '.', '_', '-'). The controller makes the secret and
keeps only its hash: the secret is printed this once. Send it as "Authorization: Bearer SECRET"
to a service's endpoint or the gateway.`,
		Example: `  ferry keys create alice
  ferry keys create ci-bot --team platform --service chat --model llama-3-8b --priority batch --expires 30d
  ferry keys create demo --rpm 10 --tpd 200000 --budget-usd 5 --budget-period day --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := api.CreateKeyRequest{Name: args[0], Team: f.team, Services: f.services, Models: f.models, Priority: f.priority,
				PriorityHeader: f.priorityHeader, Limits: f.limits.patch(cmd.Flags())}
			if f.expires != "" {
				t, err := parseExpiry(f.expires, time.Now())
				if err != nil {
					return err
				}
				req.ExpiresAt = t
			}
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			k, err := c.CreateKey(ctx, req)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), k)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "Created key %s (%s)%s.\n\n  %s\n\n", k.Name, k.ID, teamSuffix(k.Team), k.Secret)
			fmt.Fprintln(out, "This is the key's secret. Store it now: it will not be shown again (Ferry keeps only its hash).")
			return nil
		},
	}
	f = addKeyFlags(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the key, secret included, as JSON")
	return cmd
}

func teamSuffix(team string) string {
	if team == "" {
		return ""
	}
	return ", team " + team
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newKeysListCmd() *cobra.Command {
	return newListCmd("List the API keys (never their secrets), revoked and expired ones too",
		`  ferry keys list
  ferry keys list --json | jq '.[] | select(.state == "active") | .name'`,
		(*api.Client).Keys, printKeys)
}

// newListCmd is a `list` command of ferry keys: what fetch gets from the controller, printed by
// print or, with --json, as JSON.
func newListCmd[T any](short, example string, fetch func(*api.Client, context.Context) (T, error), print func(io.Writer, T)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list",
		Short:   short,
		Example: example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			list, err := fetch(c, ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), list)
			}
			print(cmd.OutOrStdout(), list)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func printKeys(out io.Writer, list []api.KeyInfo) {
	if len(list) == 0 {
		fmt.Fprintln(out, "No API keys. Create one with: ferry keys create NAME")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tTEAM\tHINT\tSCOPE\tPRIORITY\tLIMITS\tEXPIRES\tSTATE")
	for _, k := range list {
		prio := k.Priority
		if k.PriorityHeader {
			prio += " (header)"
		}
		expires := "never"
		if !k.ExpiresAt.IsZero() {
			expires = k.ExpiresAt.UTC().Format("2006-01-02 15:04")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, orDash(k.Team), k.Hint, scopeText(k.Services, k.Models),
			prio, limitsText(k.Limits), expires, k.State)
	}
	_ = tw.Flush()
}

func scopeText(services, models []string) string {
	var parts []string
	if len(services) > 0 {
		parts = append(parts, "services="+strings.Join(services, ","))
	}
	if len(models) > 0 {
		parts = append(parts, "models="+strings.Join(models, ","))
	}
	if len(parts) == 0 {
		return "all"
	}
	return strings.Join(parts, " ")
}

// limitsText is limits in a few words: "60rpm 2M tpd $5/month"; "-" for none.
func limitsText(l tenants.Limits) string {
	var parts []string
	for _, f := range []struct {
		v    int64
		unit string
	}{
		{l.RequestsPerMinute, "rpm"}, {l.RequestsPerDay, "rpd"}, {l.InputTokensPerMinute, "in-tpm"}, {l.InputTokensPerDay, "in-tpd"},
		{l.OutputTokensPerMinute, "out-tpm"}, {l.OutputTokensPerDay, "out-tpd"}, {l.TotalTokensPerMinute, "tpm"}, {l.TotalTokensPerDay, "tpd"},
	} {
		if f.v > 0 {
			parts = append(parts, compactCount(f.v)+f.unit)
		}
	}
	if l.BudgetUSD > 0 {
		parts = append(parts, fmt.Sprintf("$%g/%s", l.BudgetUSD, l.BudgetPeriod))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// compactCount writes n with k, M or G when it is round enough to read so.
func compactCount(n int64) string {
	for _, u := range []struct {
		div    int64
		suffix string
	}{{1_000_000_000, "G"}, {1_000_000, "M"}, {1_000, "k"}} {
		if n >= u.div && n%(u.div/10) == 0 {
			return strconv.FormatFloat(float64(n)/float64(u.div), 'f', -1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

func newKeysRevokeCmd() *cobra.Command {
	return newActionCmd("revoke ID|NAME", "Revoke an API key at once, on every proxy; its record stays, for its usage",
		`  ferry keys revoke alice
  ferry keys revoke key_3f9a1c0b7d2e`,
		func(ctx context.Context, c *api.Client, arg string) (string, error) {
			k, err := c.RevokeKey(ctx, arg)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("Revoked key %s (%s).", k.Name, k.ID), nil
		})
}

// newActionCmd is a command of ferry keys that does one thing to what its one argument names:
// act does it and returns the sentence that says it was done.
func newActionCmd(use, short, example string, act func(ctx context.Context, c *api.Client, arg string) (string, error)) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Short:   short,
		Example: example,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			done, err := act(ctx, c, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), done)
			return nil
		},
	}
}

func newKeysUpdateCmd() *cobra.Command {
	var f *keyFlags
	cmd := &cobra.Command{
		Use:   "update ID|NAME",
		Short: "Change an API key's team, scope, expiry, priority or limits (its secret stays)",
		Long: `Change what the flags name and leave the rest: --rpm 0 lifts the per-minute request limit,
--team "" takes the key out of its team, --service and --model replace the scope (an empty value
allows every one), --expires never lifts the expiry.`,
		Example: `  ferry keys update alice --rpm 120 --priority interactive
  ferry keys update ci-bot --expires never --service ""`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := f.update(cmd.Flags(), time.Now())
			if err != nil {
				return err
			}
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			k, err := c.UpdateKey(ctx, args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Updated key %s (%s): %s, %s, limits %s.\n", k.Name, k.ID, scopeText(k.Services, k.Models), k.Priority, limitsText(k.Limits))
			return nil
		},
	}
	f = addKeyFlags(cmd.Flags())
	return cmd
}

// update is the change the flags given ask for.
func (f *keyFlags) update(fs *pflag.FlagSet, now time.Time) (api.UpdateKeyRequest, error) {
	var req api.UpdateKeyRequest
	if !fs.Changed("team") && !fs.Changed("service") && !fs.Changed("model") && !fs.Changed("expires") && !fs.Changed("priority") &&
		!fs.Changed("priority-header") && f.limits.patch(fs) == (api.LimitsPatch{}) {
		return req, errors.New("nothing to change: give at least one flag (see --help)")
	}
	if fs.Changed("team") {
		req.Team = &f.team
	}
	if fs.Changed("service") {
		services := nonEmpty(f.services)
		req.Services = &services
	}
	if fs.Changed("model") {
		models := nonEmpty(f.models)
		req.Models = &models
	}
	if fs.Changed("expires") {
		t, err := parseExpiry(f.expires, now)
		if err != nil {
			return req, err
		}
		req.ExpiresAt = &t
	}
	if fs.Changed("priority") {
		req.Priority = &f.priority
	}
	if fs.Changed("priority-header") {
		req.PriorityHeader = &f.priorityHeader
	}
	req.Limits = f.limits.patch(fs)
	return req, nil
}

func nonEmpty(list []string) []string {
	out := []string{}
	for _, s := range list {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

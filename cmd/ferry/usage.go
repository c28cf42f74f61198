package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/tenants"
)

func init() { register(newUsageCmd) }

func newUsageCmd() *cobra.Command {
	var (
		since, by     string
		asJSON, asCSV bool
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show what each API key used: requests, errors, tokens and cost, per key, team, model, service or day",
		Long: `Usage is counted by every proxy per key, service, model and UTC day, and kept by the controller.
--since is a day (2026-11-01) or a number of days back including today (7d); the default is the
first day of this month (UTC). --csv is the billing export: a header and one line per key,
service, model and day, the cost in dollars with six decimals (exact).`,
		Example: `  ferry usage
  ferry usage --since 7d --by model
  ferry usage --since 2026-11-01 --by team --json
  ferry usage --since 2026-11-01 --csv > november.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			from, err := parseSince(since, now)
			if err != nil {
				return err
			}
			if asCSV && cmd.Flags().Changed("by") {
				return errors.New("--csv exports one line per key, service, model and day; drop --by")
			}
			if asCSV {
				by = ""
			}
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			rep, err := c.Usage(ctx, from, by)
			if err != nil {
				return err
			}
			switch {
			case asJSON:
				return printJSON(cmd.OutOrStdout(), rep)
			case asCSV:
				return writeUsageCSV(cmd.OutOrStdout(), rep)
			}
			printUsage(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "the first day: 2026-11-01, or 7d for the last seven days (default: this month)")
	cmd.Flags().StringVar(&by, "by", api.ByKey, "group by key, team, model, service or day")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	cmd.Flags().BoolVar(&asCSV, "csv", false, "print every key, service, model and day as CSV (the billing export)")
	return cmd
}

// parseSince reads --since: a day, N days back including today ("7d"), or "" for the first day
// of the month, all UTC.
func parseSince(s string, now time.Time) (tenants.Day, error) {
	today := tenants.DayOf(now)
	if s == "" {
		t := now.UTC()
		return tenants.DayOf(time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)), nil
	}
	if n, ok := strings.CutSuffix(s, "d"); ok {
		if days, err := strconv.Atoi(n); err == nil && days > 0 {
			return today - tenants.Day(days-1), nil
		}
	}
	var d tenants.Day
	if err := d.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--since %q: want a day (2026-11-01) or days back (7d)", s)
	}
	return d, nil
}

func printUsage(out io.Writer, rep api.UsageReport) {
	fmt.Fprintf(out, "Usage since %s (UTC), by %s:\n\n", rep.Since, rep.By)
	if len(rep.Lines) == 0 {
		fmt.Fprintln(out, "No requests with an API key.")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	group := map[string]string{api.ByKey: "KEY", api.ByTeam: "TEAM", api.ByModel: "MODEL", api.ByService: "SERVICE", api.ByDay: "DAY"}[rep.By]
	fmt.Fprintf(tw, "%s\tREQUESTS\tERRORS\tINPUT TOKENS\tOUTPUT TOKENS\tCOST ($)\n", group)
	for _, l := range rep.Lines {
		name := map[string]string{api.ByKey: keyLabel(l), api.ByTeam: orDash(l.Team), api.ByModel: orDash(l.Model),
			api.ByService: orDash(l.Service), api.ByDay: l.Day}[rep.By]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", name, l.Requests, l.Errors, l.Input, l.Output, dollars(l.CostMicros))
	}
	t := rep.Total
	fmt.Fprintf(tw, "TOTAL\t%d\t%d\t%d\t%d\t%s\n", t.Requests, t.Errors, t.Input, t.Output, dollars(t.CostMicros))
	_ = tw.Flush()
}

func keyLabel(l api.UsageLine) string {
	if l.KeyName == "" {
		return l.KeyID
	}
	return l.KeyName + " (" + l.KeyID + ")"
}

// dollars is micro-dollars as a table shows them: cents, or four decimals below a dollar.
func dollars(micros int64) string {
	if micros != 0 && micros < 1_000_000 && micros > -1_000_000 {
		return fmt.Sprintf("%.4f", float64(micros)/1e6)
	}
	return fmt.Sprintf("%.2f", float64(micros)/1e6)
}

// usageCSVHeader is the billing export's header, its columns in order.
var usageCSVHeader = []string{"day", "key_id", "key_name", "team", "service", "model", "requests", "errors", "input_tokens", "output_tokens", "cost_usd"}

// cellText keeps a name a spreadsheet would take for a formula as text, by a leading quote
// (OWASP's advice for CSV injection): a model name comes from clients' requests.
func cellText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

func writeUsageCSV(out io.Writer, rep api.UsageReport) error {
	w := csv.NewWriter(out)
	if err := w.Write(usageCSVHeader); err != nil {
		return err
	}
	for _, l := range rep.Lines {
		i := strconv.FormatInt
		if err := w.Write([]string{l.Day, l.KeyID, cellText(l.KeyName), cellText(l.Team), cellText(l.Service), cellText(l.Model),
			i(l.Requests, 10), i(l.Errors, 10), i(l.Input, 10), i(l.Output, 10), api.DollarsText(l.CostMicros)}); err != nil {
			return err
		}
	}
	w.Flush()
	return w.Error()
}

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/api"
)

func init() { register(newCapacityCmd) }

func newCapacityCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "capacity",
		Short: "Show who holds what: every service replica and job node, where, and at what $/hr",
		Long: `Services and jobs share one provisioner. This lists every instance either holds, by infra,
with its price, and the total per infra. Services stand at priority 1000; a job below it that
is preemptible gives its Kubernetes GPUs back when a service needs them.`,
		Example: `  ferry capacity
  ferry capacity --json | jq 'group_by(.infra)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			list, err := c.Capacity(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			printCapacity(cmd.OutOrStdout(), list)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func printCapacity(out io.Writer, list []api.Holding) {
	if len(list) == 0 {
		fmt.Fprintln(out, "Nothing is running.")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INFRA\tZONE\tKIND\tOWNER\tUNIT\tSTATE\tRESOURCES\tSPOT\tPRIORITY\t$/HR")
	totals := map[string]float64{}
	var order []string
	var total float64
	for _, h := range list {
		prio := strconv.Itoa(configs.ServingPriority)
		if h.Kind == "job" {
			prio = strconv.Itoa(h.Priority)
			if h.Preemptible {
				prio += " (preemptible)"
			}
		}
		spot := "-"
		if h.Spot {
			spot = "spot"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\n", h.Infra, orDash(h.Zone), h.Kind, h.Owner, h.Unit, h.State,
			orDash(h.Resources), spot, prio, h.PricePerHour)
		if _, seen := totals[h.Infra]; !seen {
			order = append(order, h.Infra)
		}
		totals[h.Infra] += h.PricePerHour
		total += h.PricePerHour
	}
	_ = tw.Flush()
	fmt.Fprintln(out)
	for _, inf := range order {
		fmt.Fprintf(out, "%s: $%.2f/hr\n", inf, totals[inf])
	}
	fmt.Fprintf(out, "total: $%.2f/hr\n", total)
}

package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/tenants"
)

func newKeysTeamsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "teams",
		Short: "Set, list and delete team limits, which a team's keys share",
		Example: `  ferry keys teams set research --rpd 100000 --budget-usd 500
  ferry keys teams list
  ferry keys teams delete research`,
	}
	cmd.AddCommand(newTeamsSetCmd(), newTeamsListCmd(), newTeamsDeleteCmd())
	return cmd
}

func newTeamsSetCmd() *cobra.Command {
	var limits *limitFlags
	cmd := &cobra.Command{
		Use:   "set NAME",
		Short: "Create a team or change the limits the flags name (0 lifts one)",
		Long: `A team's limits hold for all its keys together, on top of each key's own. The first set makes
the team; later ones change only the limits they name.`,
		Example: `  ferry keys teams set research --tpm 400000 --tpd 20000000
  ferry keys teams set research --budget-usd 1000 --budget-period month`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			team, err := c.SetTeam(ctx, args[0], limits.patch(cmd.Flags()))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Team %s: limits %s.\n", team.Name, limitsText(team.Limits))
			return nil
		},
	}
	limits = addLimitFlags(cmd.Flags())
	return cmd
}

func newTeamsListCmd() *cobra.Command {
	return newListCmd("List the teams and their limits", "  ferry keys teams list\n  ferry keys teams list --json",
		(*api.Client).Teams, printTeams)
}

func printTeams(out io.Writer, teams []tenants.Team) {
	if len(teams) == 0 {
		fmt.Fprintln(out, "No team has limits. Set some with: ferry keys teams set NAME --rpm N ...")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TEAM\tLIMITS")
	for _, t := range teams {
		fmt.Fprintf(tw, "%s\t%s\n", t.Name, limitsText(t.Limits))
	}
	_ = tw.Flush()
}

func newTeamsDeleteCmd() *cobra.Command {
	return newActionCmd("delete NAME", "Lift a team's limits; its keys keep the team's name, in their usage too",
		"  ferry keys teams delete research",
		func(ctx context.Context, c *api.Client, name string) (string, error) {
			return fmt.Sprintf("Deleted team %s's limits.", name), c.DeleteTeam(ctx, name)
		})
}

func newKeysPricesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "prices",
		Short: "Set, list and delete per-model token prices, which dollar budgets and usage costs use",
		Example: `  ferry keys prices set meta-llama/Llama-3.1-8B-Instruct --input-per-million 0.05 --output-per-million 0.08
  ferry keys prices list`,
	}
	cmd.AddCommand(newPricesSetCmd(), newPricesListCmd(), newPricesDeleteCmd())
	return cmd
}

func newPricesSetCmd() *cobra.Command {
	var p api.ModelPrice
	cmd := &cobra.Command{
		Use:   "set MODEL",
		Short: "Set what a model's tokens cost, in dollars per million",
		Long: `MODEL is the name requests ask for ("model" in the body). Costs count from the next request
on; a model without a price costs nothing.`,
		Example: "  ferry keys prices set llama-3-70b --input-per-million 0.59 --output-per-million 0.79",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("input-per-million") && !cmd.Flags().Changed("output-per-million") {
				return fmt.Errorf("give --input-per-million and --output-per-million")
			}
			p.Model = args[0]
			ctx, stop, c, err := controllerFor(cmd, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stop()
			if err := c.SetPrice(ctx, p); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: $%g per million input tokens, $%g per million output tokens.\n", p.Model, p.InputPerMillion, p.OutputPerMillion)
			return nil
		},
	}
	cmd.Flags().Float64Var(&p.InputPerMillion, "input-per-million", 0, "dollars per million input (prompt) tokens")
	cmd.Flags().Float64Var(&p.OutputPerMillion, "output-per-million", 0, "dollars per million output (generated) tokens")
	return cmd
}

func newPricesListCmd() *cobra.Command {
	return newListCmd("List the model prices", "  ferry keys prices list\n  ferry keys prices list --json",
		(*api.Client).Prices, printPrices)
}

func printPrices(out io.Writer, prices []api.ModelPrice) {
	if len(prices) == 0 {
		fmt.Fprintln(out, "No model has a price: usage costs nothing and dollar budgets never run out.")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\t$/M INPUT\t$/M OUTPUT")
	for _, p := range prices {
		fmt.Fprintf(tw, "%s\t%g\t%g\n", p.Model, p.InputPerMillion, p.OutputPerMillion)
	}
	_ = tw.Flush()
}

func newPricesDeleteCmd() *cobra.Command {
	return newActionCmd("delete MODEL", "Forget a model's price: its tokens cost nothing from the next request on",
		"  ferry keys prices delete llama-3-70b",
		func(ctx context.Context, c *api.Client, model string) (string, error) {
			return fmt.Sprintf("Deleted the price of %s.", model), c.DeletePrice(ctx, model)
		})
}

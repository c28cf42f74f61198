package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/infra"
	"github.com/ferryserve/ferry/launcher/aws"
)

func init() { register(newCapacityBlocksCmd) }

// Ferry never buys an EC2 Capacity Block by itself: it is paid up front and not refundable.
// This command is the one way it does, on a person's explicit request.
func newCapacityBlocksCmd() *cobra.Command {
	var q aws.BlockQuery
	var duration, from, to string
	cmd := &cobra.Command{
		Use:   "capacity-blocks",
		Short: "List EC2 Capacity Blocks for ML on offer; buy one with `capacity-blocks buy`",
		Long: `Asks EC2 which Capacity Blocks it would sell (DescribeCapacityBlockOfferings): instance type,
count (1 to 64), duration (whole days up to 14d, whole weeks up to 182d), and optionally the
earliest start and latest end (YYYY-MM-DD or RFC 3339). Listing costs nothing. Ferry uses the
blocks the account holds (resources.capacity) but buys one only through ` + "`capacity-blocks buy`" + `.`,
		Example: `  ferry capacity-blocks --instance-type p5.48xlarge --count 2 --duration 2d --from 2026-12-01
  ferry capacity-blocks buy cb-offer-0123456789abcdef0 --region us-east-1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if q.Duration, err = parseBlockDuration(duration); err != nil {
				return err
			}
			if q.From, err = parseDay("--from", from); err != nil {
				return err
			}
			if q.To, err = parseDay("--to", to); err != nil {
				return err
			}
			return withAWS(cmd.Context(), func(ctx context.Context, p *aws.Provider) error {
				offers, err := p.CapacityBlockOfferings(ctx, q)
				if err != nil {
					return err
				}
				writeBlockOfferings(cmd.OutOrStdout(), offers)
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&q.Region, "region", "", "AWS region (default: the first configured)")
	fl.StringVar(&q.InstanceType, "instance-type", "", "instance type, e.g. p5.48xlarge")
	fl.IntVar(&q.Count, "count", 1, "instances in the block (1 to 64)")
	fl.StringVar(&duration, "duration", "1d", "how long the block lasts: 1d to 14d, then whole weeks to 182d")
	fl.StringVar(&from, "from", "", "earliest start")
	fl.StringVar(&to, "to", "", "latest end")
	_ = cmd.MarkFlagRequired("instance-type")
	cmd.AddCommand(newCapacityBlocksBuyCmd())
	return cmd
}

func newCapacityBlocksBuyCmd() *cobra.Command {
	var region string
	var yes bool
	cmd := &cobra.Command{
		Use:   "buy OFFERING-ID",
		Short: "Buy an EC2 Capacity Block offering (charges its upfront fee to the AWS account)",
		Long: `Buys the offering (PurchaseCapacityBlock, Linux/UNIX) after you type "buy": the upfront fee is
charged at once and is not refunded. The block is a Capacity Reservation (cr-…) that tasks with
resources.capacity mode queued or reserved use during its window.`,
		Example: `  ferry capacity-blocks buy cb-offer-0123456789abcdef0
  ferry capacity-blocks buy cb-offer-0123456789abcdef0 --region us-east-2 --yes`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes && !confirmPurchase(cmd.InOrStdin(), cmd.OutOrStdout(), args[0]) {
				return fmt.Errorf("not bought")
			}
			return withAWS(cmd.Context(), func(ctx context.Context, p *aws.Provider) error {
				r, err := p.PurchaseCapacityBlock(ctx, region, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Bought %s: %d × %s in %s, %s; its instances are terminated from %s UTC.\n",
					r.ID, r.Count, r.InstanceType, r.Zone, reservationWindow(r), r.End.UTC().Format("2006-01-02 15:04"))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&region, "region", "", "AWS region of the offering (default: the first configured)")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "buy without asking")
	return cmd
}

// confirmPurchase asks before money is spent; only "buy" typed in full goes ahead.
func confirmPurchase(in io.Reader, out io.Writer, offering string) bool {
	fmt.Fprintf(out, "Buying %s charges its upfront fee to your AWS account and cannot be undone. Type \"buy\" to go ahead: ", offering)
	line, _ := bufio.NewReader(in).ReadString('\n')
	return strings.TrimSpace(line) == "buy"
}

// withAWS runs f with the configured AWS provider.
func withAWS(ctx context.Context, f func(context.Context, *aws.Provider) error) error {
	return withInfras(ctx, func(ctx context.Context, set *infra.Set) error {
		for _, c := range set.Clouds() {
			if p, ok := c.(*aws.Provider); ok {
				return f(ctx, p)
			}
		}
		return fmt.Errorf("AWS is not enabled: add an aws: section to config.yaml")
	})
}

func parseBlockDuration(s string) (time.Duration, error) {
	d, ok := configs.ParseDuration(s)
	if !ok {
		return 0, fmt.Errorf("--duration %q: want e.g. 1d, 7d, 28d", s)
	}
	return d, aws.CheckBlockDuration(d)
}

// parseDay reads YYYY-MM-DD (midnight UTC) or RFC 3339; "" is no bound.
func parseDay(flag, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want YYYY-MM-DD or RFC 3339", flag, s)
	}
	return t, nil
}

func writeBlockOfferings(out io.Writer, offers []aws.BlockOffering) {
	if len(offers) == 0 {
		fmt.Fprintln(out, "EC2 offers no Capacity Block for that; try other dates, a shorter duration or fewer instances.")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OFFERING\tINSTANCES\tZONE\tSTART (UTC)\tEND (UTC)\tUPFRONT FEE")
	const layout = "2006-01-02 15:04"
	for _, o := range offers {
		fmt.Fprintf(tw, "%s\t%d × %s\t%s\t%s\t%s\t%s %s\n", o.ID, o.Count, o.InstanceType, o.Zone,
			o.Start.UTC().Format(layout), o.End.UTC().Format(layout), o.UpfrontFee, o.Currency)
	}
	_ = tw.Flush()
}

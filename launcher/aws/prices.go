package aws

import (
	"context"
	"fmt"
	"strconv"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// SpotPrices returns the current Linux spot price in region as instance type → AZ ID → USD
// per hour, from DescribeSpotPriceHistory, for the optimizer to refresh the catalog's spot
// prices. instanceTypes narrows the query; empty asks for every type (many pages).
func (p *Provider) SpotPrices(ctx context.Context, region string, instanceTypes []string) (map[string]map[string]float64, error) {
	c, err := p.client(region)
	if err != nil {
		return nil, err
	}
	var names map[string]string // AZ ID -> name, inverted below when EC2 omits the ID
	in := &ec2.DescribeSpotPriceHistoryInput{
		StartTime:           awssdk.Time(time.Now()),
		ProductDescriptions: []string{"Linux/UNIX"},
	}
	for _, t := range instanceTypes {
		in.InstanceTypes = append(in.InstanceTypes, types.InstanceType(t))
	}
	out := map[string]map[string]float64{}
	newest := map[string]time.Time{}
	pages := ec2.NewDescribeSpotPriceHistoryPaginator(c, in)
	for page := 0; pages.HasMorePages() && page < 100; page++ {
		res, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(err, "describe spot price history in "+region)
		}
		for _, sp := range res.SpotPriceHistory {
			price, err := strconv.ParseFloat(awssdk.ToString(sp.SpotPrice), 64)
			if err != nil {
				return nil, fmt.Errorf("%s: spot price %q: %w", InfraName, awssdk.ToString(sp.SpotPrice), err)
			}
			zone := awssdk.ToString(sp.AvailabilityZoneId)
			if zone == "" {
				if names == nil {
					if names, err = p.ZoneNames(ctx, region); err != nil {
						return nil, err
					}
				}
				for id, name := range names {
					if name == awssdk.ToString(sp.AvailabilityZone) {
						zone = id
					}
				}
			}
			itype := string(sp.InstanceType)
			key := itype + "/" + zone
			if at := awssdk.ToTime(sp.Timestamp); newest[key].After(at) {
				continue
			} else {
				newest[key] = at
			}
			if out[itype] == nil {
				out[itype] = map[string]float64{}
			}
			out[itype][zone] = price
		}
	}
	return out, nil
}

// SpotPlacementScores asks EC2 how likely a spot request for target instances of
// instanceTypes is to succeed, per region (1–10, higher is better), to rank regions for spot.
// Regions narrows the answer; empty means the provider's regions.
func (p *Provider) SpotPlacementScores(ctx context.Context, instanceTypes []string, target int, regions []string) (map[string]int, error) {
	if len(regions) == 0 {
		regions = p.opts.Regions
	}
	out, err := p.clients[p.opts.Regions[0]].GetSpotPlacementScores(ctx, &ec2.GetSpotPlacementScoresInput{
		InstanceTypes:  instanceTypes,
		TargetCapacity: awssdk.Int32(int32(target)),
		RegionNames:    regions,
	})
	if err != nil {
		return nil, classify(err, "get spot placement scores")
	}
	scores := map[string]int{}
	for _, s := range out.SpotPlacementScores {
		scores[awssdk.ToString(s.Region)] = int(awssdk.ToInt32(s.Score))
	}
	return scores, nil
}

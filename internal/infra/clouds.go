package infra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws"
	"github.com/ferryserve/ferry/launcher/catalog"
	"github.com/ferryserve/ferry/launcher/gcp"
	"github.com/ferryserve/ferry/launcher/optimizer"
)

// cloudSetupTimeout bounds building a cloud's clients (the SDKs read credentials then).
const cloudSetupTimeout = 30 * time.Second

// cloud is one enabled cloud: its provider and the regions the config allows.
type cloud struct {
	name     string
	provider launcher.Provider
	regions  []string
	// zones, when set, are the only zones planned (gcp.zones).
	zones []string
	// zoneNames, when the provider can tell, maps AWS AZ IDs to this account's zone names.
	zoneNames func(ctx context.Context, region string) (map[string]string, error)
	// spotPrices, when the provider can tell, are live spot prices in a region by instance
	// type and AZ ID; prices caches them.
	spotPrices func(ctx context.Context, region string, types []string) (map[string]map[string]float64, error)
	prices     *priceCache
	// spotScores, when the provider can tell, rate each region's spot capacity 1–10 (AWS's
	// GetSpotPlacementScores), cached in prices.
	spotScores func(ctx context.Context, types []string, target int, regions []string) (map[string]int, error)
}

// spotPriceTTL is how long live spot prices are reused: they move hourly at most, and a plan
// runs for every launch.
const spotPriceTTL = 5 * time.Minute

// priceCache keeps the latest spot prices per region and instance-type set, and the latest
// placement scores per instance-type set.
type priceCache struct {
	mu     sync.Mutex
	m      map[string]cachedPrices
	scores map[string]cachedScores
}

type cachedScores struct {
	at     time.Time
	scores map[string]int
}

type cachedPrices struct {
	at     time.Time
	prices map[string]map[string]float64
}

func (c cloud) livePrices(ctx context.Context, region string, types []string) (map[string]map[string]float64, error) {
	key := region + "|" + strings.Join(types, ",")
	c.prices.mu.Lock()
	if got, ok := c.prices.m[key]; ok && time.Since(got.at) < spotPriceTTL {
		c.prices.mu.Unlock()
		return got.prices, nil
	}
	c.prices.mu.Unlock()
	prices, err := c.spotPrices(ctx, region, types)
	if err != nil {
		return nil, err
	}
	c.prices.mu.Lock()
	c.prices.m[key] = cachedPrices{at: time.Now(), prices: prices}
	c.prices.mu.Unlock()
	return prices, nil
}

// regionScores rates the cloud's regions for r's spot instance types; nil when r asks for no
// spot, the cloud cannot tell, or it has one region (nothing to rank).
func (c cloud) regionScores(ctx context.Context, r configs.Resources) (map[string]int, error) {
	types := spotTypes(c.name, r)
	if c.spotScores == nil || len(types) == 0 || len(c.regions) < 2 {
		return nil, nil
	}
	key := "scores|" + strings.Join(types, ",")
	c.prices.mu.Lock()
	if got, ok := c.prices.scores[key]; ok && time.Since(got.at) < spotPriceTTL {
		c.prices.mu.Unlock()
		return got.scores, nil
	}
	c.prices.mu.Unlock()
	scores, err := c.spotScores(ctx, types, 1, c.regions)
	if err != nil {
		return nil, err
	}
	c.prices.mu.Lock()
	c.prices.scores[key] = cachedScores{at: time.Now(), scores: scores}
	c.prices.mu.Unlock()
	return scores, nil
}

// spotTypes are the cloud's instance types that carry one of r's accelerators, when r asks
// for spot at all.
func spotTypes(cloudName string, r configs.Resources) []string {
	var types []string
	for _, c := range r.Candidates() {
		if !c.UseSpot {
			continue
		}
		for _, acc := range c.Accelerators {
			for _, row := range catalog.Default().Lookup(cloudName, acc.Name) {
				if !slices.Contains(types, row.InstanceType) {
					types = append(types, row.InstanceType)
				}
			}
		}
	}
	slices.Sort(types)
	return types
}

// openClouds builds the providers of the config's aws and gcp sections. A cloud that cannot be
// set up (no credentials) is reported in problems and left out.
func openClouds(cfg *configs.FerryConfig, windowLead time.Duration, log *zap.Logger, problems map[string]error) []cloud {
	ctx, cancel := context.WithTimeout(context.Background(), cloudSetupTimeout)
	defer cancel()
	var out []cloud
	if c := cfg.AWS; c != nil {
		p, err := aws.New(ctx, aws.Options{Regions: c.Regions, Endpoint: c.Endpoint, AMIs: c.AMIs,
			IngressCIDRs: c.ProxyCIDRs, IngressSecurityGroups: c.ProxySecurityGroups, CheckpointNFS: c.CheckpointNFS,
			MountInstanceProfile: c.MountInstanceProfile, ReservationNoticeLead: windowLead, Logger: log.Named("aws")})
		if err != nil {
			problems[aws.InfraName] = err
		} else {
			out = append(out, cloud{name: p.Infra(), provider: p, regions: c.Regions, zoneNames: p.ZoneNames,
				spotPrices: p.SpotPrices, spotScores: p.SpotPlacementScores, prices: &priceCache{m: map[string]cachedPrices{}, scores: map[string]cachedScores{}}})
		}
	}
	if c := cfg.GCP; c != nil {
		regions := c.Regions
		if len(c.Zones) > 0 {
			regions = nil // the zones alone: each enabled its region for planning (cloud.zones)
		}
		p, err := gcp.New(ctx, gcp.Options{Project: c.Project, Regions: regions, Zones: c.Zones, Endpoint: c.Endpoint,
			IngressCIDRs: c.ProxyCIDRs, IngressTags: c.ProxyTags, CheckpointNFS: c.CheckpointNFS, Logger: log.Named("gcp")})
		if err != nil {
			problems[gcp.InfraName] = err
		} else {
			out = append(out, cloud{name: p.Infra(), provider: p, regions: c.Regions, zones: c.Zones})
		}
	}
	return out
}

// optimizerInfra is the optimizer's view of a cloud for r: the account's AWS zone names when
// they can be read (otherwise placements carry AZ IDs, which the provider resolves), and live
// spot prices for r's instance types when r asks for spot.
func (c cloud) optimizerInfra(ctx context.Context, r configs.Resources) (optimizer.Infra, error) {
	inf := optimizer.Infra{Name: c.name, Kind: optimizer.Cloud}
	// Each lookup that fails leaves its part to the catalog (prices) or the provider (AZ IDs);
	// the others still run, so one region's error does not cost the zone names that spot
	// spreading and preemption blocks match on.
	var errs []error
	if types := spotTypes(c.name, r); c.spotPrices != nil && len(types) > 0 {
		inf.SpotPrices = map[string]map[string]float64{}
		for _, region := range c.regions {
			prices, err := c.livePrices(ctx, region, types)
			if err != nil {
				errs = append(errs, fmt.Errorf("spot prices in %s: %w", region, err))
				continue
			}
			for t, zones := range prices {
				if inf.SpotPrices[t] == nil {
					inf.SpotPrices[t] = map[string]float64{}
				}
				maps.Copy(inf.SpotPrices[t], zones)
			}
		}
	}
	if c.zoneNames != nil {
		names := map[string]string{}
		complete := true
		for _, region := range c.regions {
			m, err := c.zoneNames(ctx, region)
			if err != nil {
				errs = append(errs, fmt.Errorf("zone names in %s: %w", region, err))
				complete = false
				continue
			}
			maps.Copy(names, m)
		}
		if complete {
			// A partial map would read as "the account lacks those zones" and drop them.
			inf.ZoneNames = names
		}
	}
	if r.Capacity.Queued() {
		errs = append(errs, c.capacityOfferings(ctx, &inf))
	}
	return inf, errors.Join(errs...)
}

// inRegions keeps cloud candidates in the regions (and, where the config names them, the
// zones) the config enables; other infras pass.
func (s *Set) inRegions(cands []optimizer.Candidate) []optimizer.Candidate {
	allowed := map[string]cloud{}
	for _, c := range s.clouds {
		allowed[c.name] = c
	}
	return slices.DeleteFunc(cands, func(c optimizer.Candidate) bool {
		cl, isCloud := allowed[c.Placement.Infra]
		if !isCloud {
			return false
		}
		if !slices.ContainsFunc(cl.regions, func(r string) bool { return strings.EqualFold(r, c.Placement.Region) }) {
			return true
		}
		return len(cl.zones) > 0 && c.Placement.Zone != "" && !slices.Contains(cl.zones, c.Placement.Zone)
	})
}

package infra

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/aws"
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
	// zoneNames, when the provider can tell, maps AWS AZ IDs to this account's zone names.
	zoneNames func(ctx context.Context, region string) (map[string]string, error)
}

// openClouds builds the providers of the config's aws and gcp sections. A cloud that cannot be
// set up (no credentials) is reported in problems and left out.
func openClouds(cfg *configs.FerryConfig, log *zap.Logger, problems map[string]error) []cloud {
	ctx, cancel := context.WithTimeout(context.Background(), cloudSetupTimeout)
	defer cancel()
	var out []cloud
	if c := cfg.AWS; c != nil {
		p, err := aws.New(ctx, aws.Options{Regions: c.Regions, Endpoint: c.Endpoint, AMIs: c.AMIs, Logger: log.Named("aws")})
		if err != nil {
			problems[aws.InfraName] = err
		} else {
			out = append(out, cloud{name: p.Infra(), provider: p, regions: c.Regions, zoneNames: p.ZoneNames})
		}
	}
	if c := cfg.GCP; c != nil {
		p, err := gcp.New(ctx, gcp.Options{Project: c.Project, Regions: c.Regions, Endpoint: c.Endpoint, Logger: log.Named("gcp")})
		if err != nil {
			problems[gcp.InfraName] = err
		} else {
			out = append(out, cloud{name: p.Infra(), provider: p, regions: c.Regions})
		}
	}
	return out
}

// optimizerInfra is the optimizer's view of a cloud, with the account's AWS zone names when
// they can be read (otherwise placements carry AZ IDs, which the provider resolves).
func (c cloud) optimizerInfra(ctx context.Context) (optimizer.Infra, error) {
	inf := optimizer.Infra{Name: c.name, Kind: optimizer.Cloud}
	if c.zoneNames == nil {
		return inf, nil
	}
	names := map[string]string{}
	for _, region := range c.regions {
		m, err := c.zoneNames(ctx, region)
		if err != nil {
			return inf, err
		}
		maps.Copy(names, m)
	}
	inf.ZoneNames = names
	return inf, nil
}

// inRegions keeps cloud candidates in the regions the config enables; other infras pass.
func (s *Set) inRegions(cands []optimizer.Candidate) []optimizer.Candidate {
	allowed := map[string][]string{}
	for _, c := range s.clouds {
		allowed[c.name] = c.regions
	}
	return slices.DeleteFunc(cands, func(c optimizer.Candidate) bool {
		regions, isCloud := allowed[c.Placement.Infra]
		return isCloud && !slices.ContainsFunc(regions, func(r string) bool { return strings.EqualFold(r, c.Placement.Region) })
	})
}

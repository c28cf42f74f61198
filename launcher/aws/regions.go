package aws

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ferryserve/ferry/launcher"
)

// EC2's API is regional, and a region fails on its own: an outage, throttling, a region not
// enabled for the account. What reads every region (List, Reservations, Offerings) asks them
// at once and reports a region that fails as a launcher.Gap, so that one region's failure
// neither hides the others' answers nor holds them for its own timeouts.

// perRegion runs read for every region at once and returns, in region order, what the regions
// that answered read, and a Gap{Infra: "aws", Region: r} for each region that failed or had
// not answered when ctx ended (its call still ends with ctx; the answers of the regions that
// did answer are not held for it).
func perRegion[T any](ctx context.Context, regions []string, read func(ctx context.Context, region string) ([]T, error)) ([]T, []launcher.Gap) {
	type answer struct {
		items []T
		err   error
	}
	answers := make([]chan answer, len(regions))
	for i, region := range regions {
		answers[i] = make(chan answer, 1)
		if err := launcher.Skip(ctx, region, ""); err != nil {
			answers[i] <- answer{err: err} // known to be down: not asked again (the provisioner probes it)
			continue
		}
		go func() {
			items, err := read(ctx, region)
			answers[i] <- answer{items, err}
		}()
	}
	var out []T
	var gaps []launcher.Gap
	for i, region := range regions {
		var a answer
		select {
		case a = <-answers[i]:
		case <-ctx.Done():
			select {
			case a = <-answers[i]:
			default:
				a.err = fmt.Errorf("%w: %s: region %s did not answer before the caller's deadline: %w", launcher.ErrUnavailable, InfraName, region, context.Cause(ctx))
			}
		}
		if a.err != nil {
			gaps = append(gaps, launcher.Gap{Infra: InfraName, Region: region, Err: a.err})
			continue
		}
		out = append(out, a.items...)
	}
	return out, gaps
}

// regionsError is the error of a read of every region that left gaps: a launcher.PartialList
// naming them, to be returned with what the other regions read; or, when every region failed
// and none for the infra's own failing (an invalid request, a caller that gave up, credentials
// refused everywhere), the first region's error alone, as the whole read failed; when every
// region failed for the infra's own failing, one gap for the whole infra.
func (p *Provider) regionsError(gaps []launcher.Gap) error {
	infraFault := func(g launcher.Gap) bool {
		return launcher.IsInfraFault(g.Err) && !errors.Is(g.Err, launcher.ErrUnauthorized)
	}
	if len(gaps) > 0 && len(gaps) == len(p.opts.Regions) && !slices.ContainsFunc(gaps, infraFault) {
		return gaps[0].Err
	}
	if len(gaps) > 1 && len(gaps) == len(p.opts.Regions) {
		// Every region failed: that is the infra failing, which its breaker must see as such
		// (a gap per region would read as regions failing one by one).
		errs := make([]error, len(gaps))
		for i, g := range gaps {
			errs[i] = fmt.Errorf("%s: %w", g.Region, g.Err)
		}
		return launcher.PartialList([]launcher.Gap{{Infra: InfraName, Err: errors.Join(errs...)}})
	}
	return launcher.PartialList(gaps)
}

package optimizer

import (
	"cmp"
	"slices"

	"github.com/ferryserve/ferry/launcher"
)

// LowSpotScore is the spot placement score (AWS's GetSpotPlacementScores, 1–10) below which a
// region's spot capacity is unlikely enough that its placements are tried after the others.
const LowSpotScore = 4

// DemoteLowScoreRegions moves spot placements in regions that scored below LowSpotScore after
// the other placements of their group (the same alternative), keeping every other order — a
// region where spot requests tend to fail costs a failed launch and a block before failover,
// whatever its price. scores maps infra → region → score; regions without a score keep their
// place. ordered says the candidates come from `ordered` alternatives, whose groups (in
// Alternative order) stay apart; any_of alternatives are one group.
func DemoteLowScoreRegions(cands []Candidate, scores map[string]map[string]int, ordered bool) []Candidate {
	if len(scores) == 0 {
		return cands
	}
	// demoted is 1 for a spot placement in a low-score region, 0 otherwise.
	demoted := func(p *launcher.Placement) int {
		if s, ok := scores[p.Infra][p.Region]; p.Spot && ok && s < LowSpotScore {
			return 1
		}
		return 0
	}
	out := slices.Clone(cands)
	slices.SortStableFunc(out, func(a, b Candidate) int {
		if ordered && a.Alternative != b.Alternative {
			return cmp.Compare(a.Alternative, b.Alternative)
		}
		return cmp.Compare(demoted(&a.Placement), demoted(&b.Placement))
	})
	return out
}

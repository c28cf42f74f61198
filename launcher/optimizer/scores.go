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
	low := func(p *launcher.Placement) bool {
		s, ok := scores[p.Infra][p.Region]
		return p.Spot && ok && s < LowSpotScore
	}
	out := slices.Clone(cands)
	slices.SortStableFunc(out, func(a, b Candidate) int {
		if ordered && a.Alternative != b.Alternative {
			return cmp.Compare(a.Alternative, b.Alternative)
		}
		return cmpBool(!low(&a.Placement), !low(&b.Placement))
	})
	return out
}

// cmpBool orders true before false.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

package optimizer

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/launcher"
)

func TestDemoteLowScoreRegions(t *testing.T) {
	c := func(alt int, infra, region string, spot bool) Candidate {
		return Candidate{Alternative: alt, Placement: launcher.Placement{Infra: infra, Region: region, Spot: spot}}
	}
	scores := map[string]map[string]int{"aws": {"us-east-1": 2, "us-west-2": 9}}
	name := func(cs []Candidate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Placement.Infra+"/"+c.Placement.Region)
		}
		return out
	}
	anyOf := []Candidate{
		c(0, "kubernetes/lab", "", false), c(0, "aws", "us-east-1", true), c(1, "gcp", "us-central1", true),
		c(0, "aws", "us-west-2", true), c(0, "aws", "eu-west-1", true),
	}
	// us-east-1 scored 2: after every other placement; unscored eu-west-1 keeps its place.
	want := []string{"kubernetes/lab/", "gcp/us-central1", "aws/us-west-2", "aws/eu-west-1", "aws/us-east-1"}
	if diff := cmp.Diff(want, name(DemoteLowScoreRegions(anyOf, scores, false))); diff != "" {
		t.Errorf("any_of (-want +got):\n%s", diff)
	}
	// ordered: the demotion stays inside its alternative.
	ordered := []Candidate{c(0, "aws", "us-east-1", true), c(0, "aws", "us-west-2", true), c(1, "gcp", "us-central1", true)}
	want = []string{"aws/us-west-2", "aws/us-east-1", "gcp/us-central1"}
	if diff := cmp.Diff(want, name(DemoteLowScoreRegions(ordered, scores, true))); diff != "" {
		t.Errorf("ordered (-want +got):\n%s", diff)
	}
	// On-demand placements are not about spot capacity.
	od := []Candidate{c(0, "aws", "us-east-1", false), c(0, "aws", "us-west-2", false)}
	if diff := cmp.Diff([]string{"aws/us-east-1", "aws/us-west-2"}, name(DemoteLowScoreRegions(od, scores, false))); diff != "" {
		t.Errorf("on-demand (-want +got):\n%s", diff)
	}
}

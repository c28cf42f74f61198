package jobs

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/provision"
)

// The provisioner the controller gives the manager lists by infra.
var _ infraLister = (*provision.Provisioner)(nil)

func TestHiddenNodes(t *testing.T) {
	gang := Job{Nodes: []Node{
		{Rank: 0, InstanceID: "a", Infra: "gcp", Region: "us-central1", Zone: "us-central1-a"},
		{Rank: 1, InstanceID: "b", Infra: "gcp", Region: "us-central1", Zone: "us-central1-a"},
	}}
	down := fmt.Errorf("gcp: HTTP 503: %w", launcher.ErrUnavailable)
	tests := []struct {
		name      string
		err       error
		wantWhere string // "" when every node is seen
	}{
		{"complete list", nil, ""},
		{"the whole infra", launcher.PartialList([]launcher.Gap{{Infra: "gcp", Err: down}}), "gcp"},
		{"its region", launcher.PartialList([]launcher.Gap{{Infra: "gcp", Region: "us-central1", Err: down}}), "gcp/us-central1"},
		{"its zone", launcher.PartialList([]launcher.Gap{{Infra: "gcp", Region: "us-central1", Zone: "us-central1-a", Err: down}}), "gcp/us-central1-a"},
		{"another zone", launcher.PartialList([]launcher.Gap{{Infra: "gcp", Region: "us-central1", Zone: "us-central1-b", Err: down}}), ""},
		{"another infra", launcher.PartialList([]launcher.Gap{{Infra: "aws", Region: "us-east-1", Err: down}}), ""},
		{"its zone does not exist: it holds nothing", launcher.PartialList([]launcher.Gap{{Infra: "gcp", Zone: "us-central1-a",
			Err: fmt.Errorf("zone: %w", launcher.ErrNotFound)}}), ""},
		{"a listing that failed whole", errors.New("boom"), "gcp"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, gaps := listGaps(gang, nil, tc.err)
			if got := gapsWhere(hiddenNodes(gang, gaps)); got != tc.wantWhere {
				t.Errorf("hidden %q, want %q", got, tc.wantWhere)
			}
		})
	}
}

func TestLeftNote(t *testing.T) {
	sel := map[string]string{launcher.LabelJob: "7"}
	tests := []struct {
		name   string
		reason string
		left   []launcher.Leftover
		want   string
	}{
		{"nothing left", "cancelled by the user", nil, "cancelled by the user"},
		{"nodes and the infra", "cancelled by the user", []launcher.Leftover{
			{Infra: "gcp", InstanceID: "a"}, {Infra: "gcp", InstanceID: "b"}, {Infra: "gcp", Selector: sel}},
			"cancelled by the user; 2 node(s) left on gcp, stopped when gcp answers again"},
		{"an infra not listed", "every node exited 0", []launcher.Leftover{{Infra: "aws", Selector: sel}, {Infra: "gcp", InstanceID: "a"}},
			"every node exited 0; aws could not be listed: any node of it there is stopped when aws answers again; 1 node(s) left on gcp, stopped when gcp answers again"},
		{"said once", "cancelled by the user; 1 node(s) left on gcp, stopped when gcp answers again", []launcher.Leftover{{Infra: "gcp", InstanceID: "a"}},
			"cancelled by the user; 1 node(s) left on gcp, stopped when gcp answers again"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := withLeftNote(tc.reason, tc.left); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

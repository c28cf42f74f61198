package controller

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/provision"
	"github.com/ferryserve/ferry/replicas"
)

// The controller's view of its infras, for people: what the provisioner's breakers say, the
// errors they counted and what teardowns left behind. Everything here reads memory, never an
// infra, so that `ferry check`, `serve status` and `jobs queue` answer at once while an infra
// hangs (docs/placement.md, "When an infra fails").

// Infras implements api.Backend. A controller that does not lead (it has no provisioner) knows
// nothing of infras: its API forwards this route to the leader.
func (c *Controller) Infras() api.InfraHealth {
	if c.provider == nil {
		return api.InfraHealth{}
	}
	return infraHealth(c.provider)
}

// infraHealth is p's breakers, error counts by infra then class, and leftovers.
func infraHealth(p *provision.Provisioner) api.InfraHealth {
	h := p.Health()
	errs := h.Errors()
	out := api.InfraHealth{States: h.States(), Errors: make([]api.InfraErrors, 0, len(errs)), Leftovers: p.Leftovers()}
	for k, n := range errs {
		out.Errors = append(out.Errors, api.InfraErrors{Infra: k.Infra, Class: k.Class, Count: n})
	}
	slices.SortFunc(out.Errors, func(a, b api.InfraErrors) int {
		return cmp.Or(strings.Compare(a.Infra, b.Infra), strings.Compare(a.Class, b.Class))
	})
	return out
}

// addInfraHealth adds to a service's status what its replica manager could not list lately
// and the breakers of the infras that matter to it (serviceInfras).
func (c *Controller) addInfraHealth(s *service, st *api.ServiceStatus) {
	gaps := s.mgr.Unknown()
	st.Unknown = api.UnknownParts(gaps)
	if c.provider != nil {
		st.Infras = serviceInfras(c.provider.Health().States(), st.Replicas, gaps)
	}
}

// serviceInfras picks, of the breakers' states, those of the infras a service's live replicas
// are on and of those its listing could not read. Of an infra's zones only those not up are
// kept: a zone that answers says nothing a reader needs. An infra a replica names that has no
// breaker (disabled since) is shown as Health shows one never heard from: up.
func serviceInfras(states []launcher.InfraState, recs []replicas.Record, gaps []launcher.Gap) []launcher.InfraState {
	infras := map[string]bool{}
	for _, r := range recs {
		if r.Infra != "" && !r.Status.Terminal() {
			infras[r.Infra] = true
		}
	}
	for _, g := range gaps {
		infras[g.Infra] = true
	}
	var out []launcher.InfraState
	for _, s := range states {
		if infras[s.Infra] && (s.Zone == "" || s.State != launcher.InfraUp) {
			out = append(out, s)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(infras)) {
		if !slices.ContainsFunc(out, func(s launcher.InfraState) bool { return s.Infra == name && s.Zone == "" }) {
			out = append(out, launcher.InfraState{Infra: name, State: launcher.InfraUp})
		}
	}
	slices.SortStableFunc(out, func(a, b launcher.InfraState) int {
		return cmp.Or(strings.Compare(a.Infra, b.Infra), strings.Compare(a.Zone, b.Zone))
	})
	return out
}

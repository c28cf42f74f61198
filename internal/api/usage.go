package api

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/ferryserve/ferry/tenants"
)

// Usage groups, as `ferry usage --by` names them; "" is every row as stored (the billing
// export's lines).
const (
	ByKey     = "key"
	ByTeam    = "team"
	ByModel   = "model"
	ByService = "service"
	ByDay     = "day"
)

var usageGroups = []string{ByKey, ByTeam, ByModel, ByService, ByDay}

func checkGroup(by string) error {
	if by != "" && !slices.Contains(usageGroups, by) {
		return invalid("by %q: want key, team, model, service or day", by)
	}
	return nil
}

// UsageReport is the usage since a day, in lines grouped By, and their total.
type UsageReport struct {
	Since tenants.Day `json:"since"`
	By    string      `json:"by,omitempty"`
	Lines []UsageLine `json:"lines"`
	Total UsageLine   `json:"total"`
}

// UsageLine is the use of one group: the fields of the group are set (all of them for a
// stored row), the others empty. Cost is in micro-dollars (exact sums) and in dollars.
type UsageLine struct {
	Day     string `json:"day,omitempty"`
	KeyID   string `json:"key_id,omitempty"`
	KeyName string `json:"key_name,omitempty"`
	Team    string `json:"team,omitempty"`
	Service string `json:"service,omitempty"`
	Model   string `json:"model,omitempty"`
	tenants.Totals
	CostUSD float64 `json:"cost_usd"`
}

// DollarsText is micro-dollars as dollars with all six decimals: exact, for a billing export.
func DollarsText(micros int64) string {
	sign := ""
	if micros < 0 {
		sign, micros = "-", -micros
	}
	return fmt.Sprintf("%s%d.%06d", sign, micros/1e6, micros%1e6)
}

// report groups rows (ordered as the store orders them) by by; key names come from d, whose
// revoked keys are kept for this.
func report(rows []tenants.Row, d tenants.Directory, since tenants.Day, by string) UsageReport {
	names := make(map[string]string, len(d.Keys))
	for _, k := range d.Keys {
		names[k.ID] = k.Name
	}
	out := UsageReport{Since: since, By: by, Lines: []UsageLine{}}
	at := map[UsageLine]int{}
	for _, r := range rows {
		l := lineOf(r, names[r.KeyID], by)
		i, ok := at[l]
		if !ok {
			i = len(out.Lines)
			at[l] = i
			out.Lines = append(out.Lines, l)
		}
		out.Lines[i].Totals.Add(r.Totals)
		out.Total.Totals.Add(r.Totals)
	}
	if by != "" && by != ByDay {
		slices.SortStableFunc(out.Lines, func(a, b UsageLine) int {
			return cmp.Or(cmp.Compare(a.KeyName, b.KeyName), cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Team, b.Team),
				cmp.Compare(a.Service, b.Service), cmp.Compare(a.Model, b.Model))
		})
	}
	for i := range out.Lines {
		out.Lines[i].CostUSD = float64(out.Lines[i].CostMicros) / 1e6
	}
	out.Total.CostUSD = float64(out.Total.CostMicros) / 1e6
	return out
}

// lineOf is the group r falls in, with no counts yet.
func lineOf(r tenants.Row, keyName, by string) UsageLine {
	switch by {
	case ByKey:
		return UsageLine{KeyID: r.KeyID, KeyName: keyName}
	case ByTeam:
		return UsageLine{Team: r.Team}
	case ByModel:
		return UsageLine{Model: r.Model}
	case ByService:
		return UsageLine{Service: r.Service}
	case ByDay:
		return UsageLine{Day: r.Day.String()}
	}
	return UsageLine{Day: r.Day.String(), KeyID: r.KeyID, KeyName: keyName, Team: r.Team, Service: r.Service, Model: r.Model}
}

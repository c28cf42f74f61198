package configs

import (
	"cmp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Objectives the optimizer can minimise (resources.objective).
const (
	// ObjectiveCostPerHour ranks by price per hour: the default, SkyPilot's only one.
	ObjectiveCostPerHour = "cost_per_hour"
	// ObjectiveCostPerToken ranks serving placements by dollars per generated token.
	ObjectiveCostPerToken = "cost_per_token"
	// ObjectiveCostPerStep ranks training placements by dollars per unit of work, counting the
	// work a spot interruption loses.
	ObjectiveCostPerStep = "cost_per_step"
)

var objectives = []string{ObjectiveCostPerHour, ObjectiveCostPerToken, ObjectiveCostPerStep}

// Objective is what the optimizer minimises, and the facts the cost-per-work objectives need.
// Zero fields take the optimizer's defaults (launcher/optimizer/objective.go).
//
//	objective: cost_per_step
//	objective: {minimize: cost_per_step, checkpoint_minutes: 10, restart_minutes: 5}
//	objective: {minimize: cost_per_token, model_size: 70B}
type Objective struct {
	// Minimize is one of the Objective* names; "" is cost_per_hour.
	Minimize string `json:"minimize,omitempty" yaml:"minimize"`
	// CheckpointMinutes and RestartMinutes size the work a spot interruption loses: half a
	// checkpoint interval on average, plus the restart.
	CheckpointMinutes float64 `json:"checkpoint_minutes,omitempty" yaml:"checkpoint_minutes,omitempty"`
	RestartMinutes    float64 `json:"restart_minutes,omitempty" yaml:"restart_minutes,omitempty"`
	// ModelSizeB is the served model's size in billions of parameters ("70B" in YAML).
	ModelSizeB float64 `json:"model_size_b,omitempty" yaml:"model_size,omitempty"`
	// Nodes is the gang size (not written under objective): the task's num_nodes, or an
	// alternative's own shape. A spot gang is interrupted whenever any of its nodes is, and
	// gangs of different shapes compare by what the whole gang costs. Kept in JSON, so that the
	// controller's plan counts it as the CLI's does.
	Nodes int `json:"nodes,omitempty" yaml:"-"`
}

// withNodes records the gang size in the objective of r and of its alternatives (the task's n,
// or an alternative's own num_nodes) where the optimizer reads it: a per-work objective, or
// alternatives of different shapes.
func (r Resources) withNodes(n int) Resources {
	if !r.Objective.PerWork() && !r.HasShapes() {
		return r
	}
	r.Objective.Nodes = n
	for _, alts := range [][]Resources{r.AnyOf, r.Ordered} {
		for i := range alts {
			alts[i].Objective.Nodes = cmp.Or(alts[i].NumNodes, n)
		}
	}
	return r
}

// PerWork reports whether the objective ranks by cost per unit of work (then spot and
// on-demand candidates may be mixed: their expected costs are comparable).
func (o Objective) PerWork() bool {
	return o.Minimize == ObjectiveCostPerToken || o.Minimize == ObjectiveCostPerStep
}

var objectiveKeys = keysOf[Objective]()

// objective reads resources.objective: a name, or a mapping with minimize and its facts.
func (c *checker) objective(n *yaml.Node, field string) Objective {
	var o Objective
	name := func(v *yaml.Node, f string) {
		s, ok := c.str(v, f)
		if !ok {
			return
		}
		for _, valid := range objectives {
			if s == valid {
				o.Minimize = s
				return
			}
		}
		c.errorf(v, f, "unknown objective %s%s", quoteShort(s), suggest(s, objectives, "objective"))
	}
	if n.Kind != yaml.MappingNode {
		name(n, field)
		return o
	}
	f, _ := c.fields(n, field, objectiveKeys)
	if e, ok := f["minimize"]; ok {
		name(e.value, joinField(field, "minimize"))
	} else {
		c.errorf(n, joinField(field, "minimize"), "required: one of %s", strings.Join(objectives, ", "))
	}
	if e, ok := f["checkpoint_minutes"]; ok {
		o.CheckpointMinutes, _ = c.numberAbove(e.value, joinField(field, "checkpoint_minutes"), 0, 7*24*60)
	}
	if e, ok := f["restart_minutes"]; ok {
		o.RestartMinutes, _ = c.numberAbove(e.value, joinField(field, "restart_minutes"), 0, 7*24*60)
	}
	if e, ok := f["model_size"]; ok {
		fld := joinField(field, "model_size")
		s, _ := c.str(e.value, fld)
		v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSuffix(s, "B"), "b"), 64)
		if err != nil || !(v > 0) || v > 100000 {
			c.errorf(e.value, fld, "expected a model size in billions of parameters such as 8B or 70B, got %s", quoteShort(s))
		} else {
			o.ModelSizeB = v
		}
	}
	return o
}

// resolvedValue writes model_size as it is read, "70B".
func (o Objective) resolvedValue(key string) (any, bool) {
	if key != "model_size" {
		return nil, false
	}
	if o.ModelSizeB <= 0 {
		return nil, true
	}
	return strconv.FormatFloat(o.ModelSizeB, 'f', -1, 64) + "B", true
}

// HasShapes reports whether an alternative of r has a gang size of its own (num_nodes).
func (r Resources) HasShapes() bool {
	for _, alts := range [][]Resources{r.AnyOf, r.Ordered} {
		for _, a := range alts {
			if a.NumNodes > 0 {
				return true
			}
		}
	}
	return false
}

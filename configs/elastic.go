package configs

import (
	"gopkg.in/yaml.v3"
)

// Elastic jobs: SkyPilot's DYNAMIC_NODE_SET recovery strategy, with min_nodes beside it in
// resources.job_recovery:
//
//	num_nodes: 8
//	resources:
//	  job_recovery:
//	    strategy: DYNAMIC_NODE_SET
//	    min_nodes: 4
//
// The job runs on as many of its num_nodes as can be placed together, down to min_nodes, and
// grows back to num_nodes when capacity returns (jobs/elastic.go). min_nodes defaults to 1.

// RecoveryDynamicNodeSet is SkyPilot's elastic strategy: the gang's size follows capacity
// between min_nodes and num_nodes.
const RecoveryDynamicNodeSet = "DYNAMIC_NODE_SET"

// Elastic reports whether the job's gang may run smaller than num_nodes.
func (r JobRecovery) Elastic() bool { return r.Strategy == RecoveryDynamicNodeSet }

// minNodes reads job_recovery.min_nodes.
func (c *checker) minNodes(n *yaml.Node, field string, r *JobRecovery) {
	if v, ok := c.intAtLeast(n, joinField(field, "min_nodes"), 1); ok {
		r.MinNodes = v
	}
}

// checkElastic applies the rules across job_recovery and num_nodes, and fills min_nodes' default:
// min_nodes goes with DYNAMIC_NODE_SET only, and is at most num_nodes.
func (c *checker) checkElastic(j *Job, numNodes int, recovery *entry, numNodesNode *yaml.Node) {
	r := &j.Recovery
	if recovery == nil {
		return
	}
	var minNode *yaml.Node
	if recovery.value.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(recovery.value.Content); i += 2 {
			if recovery.value.Content[i].Value == "min_nodes" {
				minNode = recovery.value.Content[i+1]
			}
		}
	}
	const field = "resources.job_recovery.min_nodes"
	switch {
	case !r.Elastic() && r.MinNodes > 0:
		c.errorf(minNode, field, "only with strategy: %s, which runs the job on fewer nodes when num_nodes cannot be placed", RecoveryDynamicNodeSet)
		r.MinNodes = 0
	case r.Elastic() && r.MinNodes > numNodes:
		at := minNode
		if at == nil {
			at = numNodesNode
		}
		c.errorf(at, field, "min_nodes %d is more than num_nodes %d", r.MinNodes, numNodes)
	case r.Elastic() && r.MinNodes == 0:
		r.MinNodes = 1
	}
}

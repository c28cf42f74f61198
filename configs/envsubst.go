package configs

import (
	"maps"
	"regexp"

	"gopkg.in/yaml.v3"
)

// SkyPilot fills the task's envs (and secrets given inline) into `service`, `file_mounts` and
// `workdir` when it reads a task, so that one YAML names a model once:
//
//	envs: {MODEL_NAME: meta-llama/Llama-3.1-8B-Instruct}
//	service: {readiness_probe: {post_data: {model: $MODEL_NAME}}}
//
// Ferry does the same, with SkyPilot's pattern: $NAME or ${NAME}, braces each optional (its
// regex's quirk, kept so the same files mean the same thing), names not among the envs left as
// written. `setup` and `run` are left alone: the shell expands them on the node.

// envRefRE is SkyPilot's pattern for a reference to an env.
var envRefRE = regexp.MustCompile(`\$\{?\b([a-zA-Z_][a-zA-Z0-9_]*)\b\}?`)

// maxSubstituteDepth bounds the copy of a substituted section (a task file is shallow).
const maxSubstituteDepth = 64

// substitutionVars is what `$NAME` may refer to: envs, then secrets (names never overlap).
func substitutionVars(envs, secrets map[string]string) map[string]string {
	vars := maps.Clone(envs)
	if vars == nil {
		vars = map[string]string{}
	}
	maps.Copy(vars, secrets)
	return vars
}

// substituted returns a copy of n with every env reference in its string scalars (keys
// included) replaced. n is copied, not changed, because an alias may share it with a section
// SkyPilot does not substitute.
func (c *checker) substituted(n *yaml.Node, vars map[string]string) *yaml.Node {
	if len(vars) == 0 {
		return n
	}
	return c.substituteCopy(n, vars, 0)
}

func (c *checker) substituteCopy(n *yaml.Node, vars map[string]string, depth int) *yaml.Node {
	n = c.deref(n)
	if depth > maxSubstituteDepth {
		return nullAt(n)
	}
	out := *n
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() == "!!str" {
			out.Value = expandEnvRefs(n.Value, vars)
			// A value that became empty or changed shape is still a string, as in SkyPilot.
			out.Tag = "!!str"
		}
	case yaml.MappingNode, yaml.SequenceNode:
		out.Content = make([]*yaml.Node, len(n.Content))
		for i, child := range n.Content {
			out.Content[i] = c.substituteCopy(child, vars, depth+1)
		}
	}
	return &out
}

// expandEnvRefs replaces $NAME and ${NAME} with vars[NAME] where NAME is known.
func expandEnvRefs(s string, vars map[string]string) string {
	return envRefRE.ReplaceAllStringFunc(s, func(ref string) string {
		m := envRefRE.FindStringSubmatch(ref)
		if v, ok := vars[m[1]]; ok {
			return v
		}
		return ref
	})
}

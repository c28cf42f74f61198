package configs

import (
	"strconv"

	"gopkg.in/yaml.v3"
)

// Job holds what only a job (a task without `service:`) reads: how it recovers and how it
// competes for capacity. Services ignore it.
type Job struct {
	// Recovery is resources.job_recovery, SkyPilot's spelling, and is written there too
	// (ResolvedYAML), not under job.
	Recovery JobRecovery `json:"recovery" yaml:"-"`
	// Priority orders the queue (higher first, then first submitted) and, where an infra
	// schedules by priority, decides against services, which run at ServingPriority.
	Priority int `json:"priority" yaml:"priority"`
	// Preemptible lets serving take the job's capacity back: the job gets SIGTERM and
	// GracePeriodSeconds to checkpoint, is stopped and requeued. Default true.
	Preemptible bool `json:"preemptible" yaml:"preemptible"`
	// GracePeriodSeconds is how long the program has between SIGTERM and SIGKILL whenever it is
	// stopped early (preempted by serving, cancelled, a spot warning where the infra allows).
	GracePeriodSeconds int `json:"grace_period_seconds" yaml:"grace_period_seconds"`
}

// JobRecovery is SkyPilot's resources.job_recovery.
type JobRecovery struct {
	// Strategy is RecoveryFailover, RecoveryEagerNextRegion or RecoveryNone.
	Strategy string `json:"strategy" yaml:"strategy"`
	// MaxRestartsOnErrors is how many times a job whose program failed (a non-zero exit) is
	// started again before it is FAILED; preemptions and lost nodes never count.
	MaxRestartsOnErrors int `json:"max_restarts_on_errors" yaml:"max_restarts_on_errors"`
	// RecoverOnExitCodes always recover, without counting against MaxRestartsOnErrors.
	RecoverOnExitCodes []int `json:"recover_on_exit_codes,omitempty" yaml:"recover_on_exit_codes,omitempty,flow"`
	// MinNodes is the fewest nodes an elastic job (RecoveryDynamicNodeSet) runs on (elastic.go).
	MinNodes int `json:"min_nodes,omitempty" yaml:"min_nodes,omitempty"`
}

// Recovery strategies, SkyPilot's names. EAGER_NEXT_REGION is SkyPilot's default.
const (
	RecoveryFailover        = "FAILOVER"
	RecoveryEagerNextRegion = "EAGER_NEXT_REGION"
	// RecoveryNone (`job_recovery: none`) fails the job on its first preemption or lost node.
	RecoveryNone = "NONE"
)

// Job defaults and bounds.
const (
	// ServingPriority is where services stand against jobs; jobs default below it, so serving
	// wins unless a job says otherwise.
	ServingPriority    = 1000
	DefaultJobPriority = 500
	MaxJobPriority     = 10000
	// DefaultGracePeriodSeconds is Kubernetes' default termination grace, and enough for most
	// checkpoints of a small model; large ones set job.grace_period_seconds.
	DefaultGracePeriodSeconds = 30
	// MaxGracePeriodSeconds is EC2's spot warning: no infra gives more before it takes a node.
	MaxGracePeriodSeconds = 120
)

// DefaultJob is the job section of a task that writes none.
func DefaultJob() Job {
	return Job{
		Recovery:           JobRecovery{Strategy: RecoveryEagerNextRegion},
		Priority:           DefaultJobPriority,
		Preemptible:        true,
		GracePeriodSeconds: DefaultGracePeriodSeconds,
	}
}

var (
	jobKeys         = keysOf[Job]()
	jobRecoveryKeys = keysOf[JobRecovery]()
	recoveryNames   = []string{RecoveryFailover, RecoveryEagerNextRegion, RecoveryDynamicNodeSet}
)

// job reads the top-level `job:` section (Ferry's: SkyPilot sets priorities through
// Kubernetes pod_config) and resources.job_recovery into t.Job.
func (c *checker) job(e *entry, recovery *entry) Job {
	j := DefaultJob()
	if recovery != nil {
		j.Recovery = c.jobRecovery(recovery.value, joinField("resources", recovery.key))
	}
	if e == nil {
		return j
	}
	f, _ := c.fields(e.value, "job", jobKeys)
	if p, ok := f["priority"]; ok {
		if v, ok := c.intAtLeast(p.value, "job.priority", 0); ok {
			if v > MaxJobPriority {
				c.errorf(p.value, "job.priority", "must be at most %d, got %d (services stand at %d)", MaxJobPriority, v, ServingPriority)
			} else {
				j.Priority = v
			}
		}
	}
	if p, ok := f["preemptible"]; ok {
		j.Preemptible, _ = c.boolean(p.value, "job.preemptible")
	}
	if p, ok := f["grace_period_seconds"]; ok {
		if v, ok := c.intAtLeast(p.value, "job.grace_period_seconds", 0); ok {
			if v > MaxGracePeriodSeconds {
				c.errorf(p.value, "job.grace_period_seconds", "must be at most %d (EC2's spot warning; no infra gives more), got %d", MaxGracePeriodSeconds, v)
			} else {
				j.GracePeriodSeconds = v
			}
		}
	}
	return j
}

// jobRecovery reads job_recovery: a strategy name, `none`, or a mapping.
func (c *checker) jobRecovery(n *yaml.Node, field string) JobRecovery {
	r := JobRecovery{Strategy: RecoveryEagerNextRegion}
	n = c.deref(n)
	if n.Kind == yaml.ScalarNode {
		s, ok := c.str(n, field)
		if !ok {
			return r
		}
		if v, ok := c.strategy(n, s, field); ok {
			r.Strategy = v
		}
		return r
	}
	f, _ := c.fields(n, field, jobRecoveryKeys)
	if e, ok := f["strategy"]; ok {
		if s, ok := c.str(e.value, joinField(field, "strategy")); ok {
			if v, ok := c.strategy(e.value, s, joinField(field, "strategy")); ok {
				r.Strategy = v
			}
		}
	}
	if e, ok := f["max_restarts_on_errors"]; ok {
		r.MaxRestartsOnErrors, _ = c.intAtLeast(e.value, joinField(field, "max_restarts_on_errors"), 0)
	}
	if e, ok := f["recover_on_exit_codes"]; ok {
		r.RecoverOnExitCodes = c.exitCodes(e.value, joinField(field, "recover_on_exit_codes"))
	}
	if e, ok := f["min_nodes"]; ok {
		c.minNodes(e.value, field, &r) // elastic.go
	}
	return r
}

// strategy accepts SkyPilot's names in any case, and none.
func (c *checker) strategy(n *yaml.Node, s, field string) (string, bool) {
	switch up := upper(s); up {
	case RecoveryFailover, RecoveryEagerNextRegion, RecoveryNone, RecoveryDynamicNodeSet:
		return up, true
	}
	c.errorf(n, field, "unknown recovery strategy %s%s, or none", quoteShort(s), suggest(upper(s), recoveryNames, "strategies"))
	return "", false
}

// exitCodes reads an int or a list of ints, each 0–255.
func (c *checker) exitCodes(n *yaml.Node, field string) []int {
	n = c.deref(n)
	items := []*yaml.Node{n}
	if n.Kind == yaml.SequenceNode {
		items = n.Content
	}
	var out []int
	for i, it := range items {
		f := field
		if n.Kind == yaml.SequenceNode {
			f = field + "[" + strconv.Itoa(i) + "]"
		}
		v, ok := c.intAtLeast(it, f, 0)
		if !ok {
			continue
		}
		if v > 255 {
			c.errorf(it, f, "an exit code is 0–255, got %d", v)
			continue
		}
		out = append(out, v)
	}
	return out
}

func upper(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if ch >= 'a' && ch <= 'z' {
			b[i] = ch - 'a' + 'A'
		}
	}
	return string(b)
}

// recoveryEntry is resources.job_recovery, or spot_recovery, its older name, which SkyPilot
// still reads with a deprecation warning (and Ferry with a note). The two are exclusive.
func (c *checker) recoveryEntry(f map[string]entry) *entry {
	jr, hasJob := f["job_recovery"]
	sr, hasSpot := f["spot_recovery"]
	switch {
	case hasSpot && hasJob:
		c.errorf(sr.keyNode, "resources.spot_recovery", "spot_recovery is the older name of job_recovery: give only job_recovery")
		return &jr
	case hasSpot:
		c.notef(sr.keyNode, "resources.spot_recovery", "spot_recovery is deprecated: read as job_recovery (write job_recovery, as SkyPilot asks)")
		return &sr
	case hasJob:
		return &jr
	}
	return nil
}

package replicas

import (
	"time"

	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/policy"
)

// Readers (Replicas, Rollout, TargetVersion, Unknown, ServiceStatus) load an immutable
// snapshot that each step that may change it republishes (step, loop.go): once the records
// are loaded (their first read may post the load), a busy loop or a store write in flight
// never stalls `serve status` or the metrics scrape.

// snapshot is the replica state as readers see it. It is never written once published.
type snapshot struct {
	// records are every replica's record, ordered by id, with when its current run of READY
	// began (zero if not READY or not yet probed OK).
	records      []Record
	healthySince []time.Time
	desired      int
	target       int
	// launchedAs maps each known version to the version its instances were launched as.
	launchedAs map[int]int
	// rollout is a copy of the latest rollout, nil if none.
	rollout *Rollout
	gaps    []launcher.Gap
	// losses are shared with the state, which replaces them rather than changing them.
	losses policy.Losses
	// spotSpare is the spare spot replicas the last pass ran (planInput.Spare).
	spotSpare int
}

// launchedAsOf is launchedAsOwned on the snapshot.
func (s *snapshot) launchedAsOf(v int) int {
	if n, ok := s.launchedAs[v]; ok {
		return n
	}
	return v
}

// snapshotOwned is the state as it is now, for readers.
func (m *Manager) snapshotOwned() *snapshot {
	s := &snapshot{desired: m.desired, target: m.target, gaps: m.gaps, launchedAs: make(map[int]int, len(m.versions)),
		losses: m.losses, spotSpare: m.spotSpare}
	for _, id := range sortedKeys(m.replicas) {
		r := m.replicas[id]
		s.records = append(s.records, r.rec)
		s.healthySince = append(s.healthySince, r.healthySince)
	}
	for n, v := range m.versions {
		s.launchedAs[n] = launchedAsOr(v, n)
	}
	if m.rollout != nil {
		r := *m.rollout
		s.rollout = &r
	}
	return s
}

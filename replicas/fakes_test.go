package replicas

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryserve/ferry/launcher"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakeStore keeps records in memory.
type fakeStore struct {
	mu      sync.Mutex
	next    map[string]int
	records map[string]map[int]Record
	saves   int
	// rollouts are every SaveRollout, in order.
	rollouts []Rollout
	// held, while set, holds every SaveReplica until it is closed (holdSaves).
	held, entered chan struct{}
}

// holdSaves holds every SaveReplica from now until release; entered gets one value for each
// save that began to wait.
func (s *fakeStore) holdSaves() (entered <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held, s.entered = make(chan struct{}), make(chan struct{}, 100)
	held := s.held
	return s.entered, sync.OnceFunc(func() {
		s.mu.Lock()
		s.held = nil
		s.mu.Unlock()
		close(held)
	})
}

var (
	_ Store        = (*fakeStore)(nil)
	_ RolloutStore = (*fakeStore)(nil)
)

func (s *fakeStore) SaveRollout(service string, r Rollout) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rollouts = append(s.rollouts, r)
	return nil
}

func (s *fakeStore) StartUpdate(service string, v Version, r Rollout) error {
	return s.SaveRollout(service, r)
}

func (s *fakeStore) lastRollout() (Rollout, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.rollouts) == 0 {
		return Rollout{}, false
	}
	return s.rollouts[len(s.rollouts)-1], true
}

func newFakeStore() *fakeStore {
	return &fakeStore{next: map[string]int{}, records: map[string]map[int]Record{}}
}

func (s *fakeStore) NextReplicaIDs(service string, n int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := s.next[service] + 1
	s.next[service] += n
	return first, nil
}

func (s *fakeStore) SaveReplica(r Record) error {
	s.mu.Lock()
	if held := s.held; held != nil {
		s.entered <- struct{}{}
		s.mu.Unlock()
		<-held
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if s.records[r.Service] == nil {
		s.records[r.Service] = map[int]Record{}
	}
	s.records[r.Service][r.ID] = r
	s.saves++
	return nil
}

func (s *fakeStore) DeleteReplica(service string, id int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.records[service], id)
	return nil
}

func (s *fakeStore) ListReplicas(service string) ([]Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Record
	for _, r := range s.records[service] {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Record) int { return a.ID - b.ID })
	return out, nil
}

func (s *fakeStore) get(service string, id int) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.records[service][id]
	return r, ok
}

// fakeProvider makes each instance a real HTTP server on loopback whose health the test
// switches, so probes run for real.
type fakeProvider struct {
	t  *testing.T
	mu sync.Mutex
	// unhealthyAtStart makes new instances answer 503 until made healthy.
	unhealthyAtStart bool
	// nodesPending makes the nodes of a gang other than its head start PENDING.
	nodesPending bool
	launchErr    error
	seq          int
	insts        map[string]*fakeInstance
	specs        []launcher.Spec
	terminated   []string
	launchBlock  chan struct{} // when set, Launch waits for it to close
	preempted    []launcher.Instance
	// gaps, when set, are reported by List, which then lists nothing they cover: the infra
	// (or part of it) does not answer. Terminate of an instance they cover is left behind.
	gaps []launcher.Gap
	// leftovers are what was left behind (LeftoverKeeper).
	leftovers []launcher.Leftover
	lists     int
	// trailing makes List leave out the instances Launch made until catchUp, as a List from a
	// cache that trails the launches does (an informer on a busy API server, EC2's eventually
	// consistent DescribeInstances).
	trailing bool
	unlisted map[string]bool
	// zone, when set, places each launch: the instance's zone, or an error that fails it.
	zone func(launcher.Spec) (string, error)
}

// trail makes List leave out new launches until catchUp.
func (p *fakeProvider) trail() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trailing, p.unlisted = true, map[string]bool{}
}

// catchUp makes List show every launch again.
func (p *fakeProvider) catchUp() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trailing, p.unlisted = false, nil
}

// vanish removes a replica's instance with no trace, as someone deleting it outside Ferry.
func (p *fakeProvider) vanish(id int) {
	fi := p.byReplica(id)
	p.mu.Lock()
	defer p.mu.Unlock()
	fi.srv.Close()
	delete(p.insts, fi.inst.ID)
}

// LeaveBehind implements launcher.LeftoverKeeper.
func (p *fakeProvider) LeaveBehind(l launcher.Leftover) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leftovers = append(p.leftovers, l)
	return nil
}

// Leftovers implements launcher.LeftoverKeeper.
func (p *fakeProvider) Leftovers() []launcher.Leftover {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.leftovers)
}

// setGaps makes List and Terminate fail over gaps (none: answer again).
func (p *fakeProvider) setGaps(gaps ...launcher.Gap) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gaps = gaps
}

// listsSince counts the Lists answered.
func (p *fakeProvider) listCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lists
}

// Preempted implements PreemptionRecorder.
func (p *fakeProvider) Preempted(inst launcher.Instance) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.preempted = append(p.preempted, inst)
}

type fakeInstance struct {
	inst    launcher.Instance
	srv     *httptest.Server
	healthy atomic.Bool
}

var _ launcher.Provider = (*fakeProvider)(nil)

func newFakeProvider(t *testing.T) *fakeProvider {
	p := &fakeProvider{t: t, insts: map[string]*fakeInstance{}}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, fi := range p.insts {
			fi.srv.Close()
		}
	})
	return p
}

func (p *fakeProvider) Launch(ctx context.Context, spec launcher.Spec) (launcher.Instance, error) {
	p.mu.Lock()
	block := p.launchBlock
	p.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return launcher.Instance{}, ctx.Err()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.specs = append(p.specs, spec)
	if p.launchErr != nil {
		return launcher.Instance{}, p.launchErr
	}
	zone := ""
	if p.zone != nil {
		var err error
		if zone, err = p.zone(spec); err != nil {
			return launcher.Instance{}, err
		}
	}
	inst := p.addLocked(spec.Name, spec.Labels, !p.unhealthyAtStart)
	if zone != "" {
		p.insts[inst.ID].inst.Zone = zone
		inst.Zone = zone
	}
	if p.trailing {
		p.unlisted[inst.ID] = true
	}
	return inst, nil
}

// add makes an instance as if an earlier controller had launched it.
func (p *fakeProvider) add(name string, labels map[string]string, healthy bool) launcher.Instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addLocked(name, labels, healthy)
}

func (p *fakeProvider) addLocked(name string, labels map[string]string, healthy bool) launcher.Instance {
	p.seq++
	fi := &fakeInstance{}
	fi.healthy.Store(healthy)
	fi.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fi.healthy.Load() {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	fi.inst = launcher.Instance{
		ID:         fmt.Sprintf("fake-%d", p.seq),
		Name:       name,
		Labels:     labels,
		Endpoint:   fi.srv.Listener.Addr().String(),
		Infra:      "fake",
		State:      launcher.StateRunning,
		LaunchedAt: time.Now(),
	}
	if p.nodesPending && labels[launcher.LabelNodeRank] != "" && labels[launcher.LabelNodeRank] != "0" {
		fi.inst.State = launcher.StatePending
	}
	p.insts[fi.inst.ID] = fi
	return fi.inst
}

func (p *fakeProvider) Terminate(ctx context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if fi, ok := p.insts[id]; ok {
		if g, in := launcher.InGaps(p.gaps, fi.inst.Infra, fi.inst.Region, fi.inst.Zone); in {
			l := launcher.Leftover{Infra: fi.inst.Infra, InstanceID: id, Reason: g.Err.Error()}
			p.leftovers = append(p.leftovers, l)
			return &launcher.LeftBehindError{Leftover: l, Err: g.Err}
		}
	}
	p.terminated = append(p.terminated, id)
	if fi, ok := p.insts[id]; ok {
		fi.srv.Close()
		delete(p.insts, id)
	}
	return nil
}

func (p *fakeProvider) List(ctx context.Context, selector map[string]string) ([]launcher.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lists++
	var out []launcher.Instance
	for _, fi := range p.insts {
		if _, hidden := launcher.InGaps(p.gaps, fi.inst.Infra, fi.inst.Region, fi.inst.Zone); hidden || p.unlisted[fi.inst.ID] {
			continue
		}
		if launcher.Matches(fi.inst.Labels, selector) {
			out = append(out, fi.inst)
		}
	}
	slices.SortFunc(out, func(a, b launcher.Instance) int {
		if a.ID < b.ID {
			return -1
		}
		return 1
	})
	return out, launcher.PartialList(slices.Clone(p.gaps))
}

// byReplica finds the instance of a replica id.
func (p *fakeProvider) byReplica(id int) *fakeInstance {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, fi := range p.insts {
		if fi.inst.Labels[launcher.LabelReplicaID] == fmt.Sprint(id) {
			return fi
		}
	}
	p.t.Fatalf("no instance for replica %d", id)
	return nil
}

// end marks a replica's instance as ended, as a provider reports an exit or a preemption.
func (p *fakeProvider) end(id int, state launcher.State, reason string) {
	fi := p.byReplica(id)
	p.mu.Lock()
	defer p.mu.Unlock()
	fi.srv.Close()
	fi.inst.State, fi.inst.Reason = state, reason
}

func (p *fakeProvider) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.insts)
}

func (p *fakeProvider) setLaunchErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.launchErr = err
}

// publications records OnReady calls and checks they never overlap.
type publications struct {
	mu      sync.Mutex
	sets    [][]Endpoint
	inCall  atomic.Int32
	overlap atomic.Bool
}

func (p *publications) onReady(eps []Endpoint) {
	if p.inCall.Add(1) > 1 {
		p.overlap.Store(true)
	}
	defer p.inCall.Add(-1)
	time.Sleep(time.Millisecond) // widen the window an overlap would need
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sets = append(p.sets, eps)
}

func (p *publications) all() [][]Endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.sets)
}

func (p *publications) last() ([]Endpoint, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.sets) == 0 {
		return nil, 0
	}
	return p.sets[len(p.sets)-1], len(p.sets)
}

// eventually polls cond until it holds, failing the test after 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

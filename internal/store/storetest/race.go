package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
)

// Writers are goroutines writing one service's state through one store at once, as a leader's
// loops do: one sets the service's status, one its target, one records new versions and the
// rollouts to them, one puts and forgets leftovers, and each replica owner takes an id from
// NextReplicaID and saves its record again and again, every third one deleting it at the end,
// twice (a delete of what is gone is success). Each goroutine makes Ops attempts and remembers
// its last write that succeeded; CheckState compares them with what a store reads.
type Writers struct {
	Service string
	// Name tags what this set writes (statuses, leftover keys) and must be unique per service.
	Name string
	// Owners is the number of replica owners, Ops the attempts each goroutine makes.
	Owners, Ops int
	// Versions are the version numbers this set records, one per attempt of the versions
	// goroutine; they must not be another set's.
	Versions []int
	// Allowed reports whether a failed write's error is one the scenario expects (a store that
	// does not lead, a service deleted meanwhile); any other error fails the check. Nil allows
	// none.
	Allowed func(error) bool
	// Gate, when set, holds every write back until it is closed.
	Gate <-chan struct{}
	// Until, when set, keeps the goroutines writing past Ops attempts until it is closed, and
	// then for two more: writes that race what closes it, and writes that come after it.
	Until <-chan struct{}

	mu         sync.Mutex
	wrote      int
	refused    int
	waiters    map[int]chan struct{}
	status     []string
	targets    []int
	rollouts   []replicas.Rollout
	started    []int
	records    map[int]replicas.Record
	ids        []int64
	leftovers  map[string]bool
	unexpected []error
}

// Start runs the goroutines on s; the channel is closed when all of them have ended.
func (w *Writers) Start(s store.Store) <-chan struct{} {
	w.mu.Lock()
	w.records, w.leftovers = map[int]replicas.Record{}, map[string]bool{}
	if w.waiters == nil {
		w.waiters = map[int]chan struct{}{}
	}
	w.mu.Unlock()
	var wg sync.WaitGroup
	run := func(f func(store.Store)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w.Gate != nil {
				<-w.Gate
			}
			f(s)
		}()
	}
	run(w.writeStatus)
	run(w.writeTarget)
	run(w.writeVersions)
	run(w.writeLeftovers)
	for owner := range w.Owners {
		run(func(s store.Store) { w.ownReplica(s, owner) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// After is closed once n writes of the set have succeeded.
func (w *Writers) After(n int) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters == nil {
		w.waiters = map[int]chan struct{}{}
	}
	ch := make(chan struct{})
	if w.wrote >= n {
		close(ch)
		return ch
	}
	w.waiters[n] = ch
	return ch
}

// LastStatus is the status of the set's last SetServiceStatus that succeeded, "" if none did.
func (w *Writers) LastStatus() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.status) == 0 {
		return ""
	}
	return w.status[len(w.status)-1]
}

// Wrote is the number of the set's writes that succeeded.
func (w *Writers) Wrote() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wrote
}

// attempts numbers the attempts of one goroutine: Ops of them, and, with Until, on until it is
// closed and two more after.
func (w *Writers) attempts(yield func(int) bool) {
	k := 0
	for ; k < w.Ops || w.Until != nil; k++ {
		if k >= w.Ops {
			select {
			case <-w.Until:
				_ = yield(k) && yield(k+1)
				return
			default:
			}
		}
		if !yield(k) {
			return
		}
	}
}

// Refused is the number of the set's writes that failed with an allowed error.
func (w *Writers) Refused() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refused
}

// outcome records the result of one write: ok runs (under the lock) when it succeeded.
func (w *Writers) outcome(what string, err error, ok func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if w.Allowed == nil || !w.Allowed(err) {
			w.unexpected = append(w.unexpected, fmt.Errorf("%s %s: %w", w.Name, what, err))
		} else {
			w.refused++
		}
		return false
	}
	ok()
	w.wrote++
	for n, ch := range w.waiters {
		if w.wrote >= n {
			close(ch)
			delete(w.waiters, n)
		}
	}
	return true
}

func (w *Writers) writeStatus(s store.Store) {
	for k := range w.attempts {
		status := fmt.Sprintf("%s-%d", w.Name, k)
		w.outcome("set status", s.SetServiceStatus(w.Service, status), func() { w.status = append(w.status, status) })
	}
}

func (w *Writers) writeTarget(s store.Store) {
	for k := range w.attempts {
		// SetTarget of a service that is gone is no error: it has no target to keep.
		w.outcome("set target", s.SetTarget(w.Service, k), func() { w.targets = append(w.targets, k) })
	}
}

func (w *Writers) writeVersions(s store.Store) {
	for _, n := range w.Versions {
		v := replicas.Version{Number: n, LaunchedAs: n, Task: &configs.Task{Run: fmt.Sprintf("serve v%d", n)}}
		r := replicas.Rollout{From: 1, To: n, Mode: configs.UpdateRolling, State: replicas.RolloutInProgress, Reason: w.Name}
		if !w.outcome("start update", s.StartUpdate(w.Service, v, r), func() { w.started = append(w.started, n); w.rollouts = append(w.rollouts, r) }) {
			continue
		}
		r.State = replicas.RolloutSucceeded
		w.outcome("save rollout", s.SaveRollout(w.Service, r), func() { w.rollouts = append(w.rollouts, r) })
	}
}

func (w *Writers) writeLeftovers(s store.Store) {
	for k := range w.attempts {
		key := fmt.Sprintf("%s-%s-i-%d", w.Service, w.Name, k)
		l := launcher.Leftover{Key: key, Infra: "aws", InstanceID: key, Owner: "service " + w.Service}
		if !w.outcome("put leftover", s.PutLeftover(l), func() { w.leftovers[key] = true }) || k%2 == 1 {
			continue
		}
		w.outcome("delete leftover", s.DeleteLeftover(key), func() { delete(w.leftovers, key) })
	}
}

// ownReplica is one replica's life: an id, then its record saved again and again.
func (w *Writers) ownReplica(s store.Store, owner int) {
	id := -1
	for k := range w.attempts {
		if id < 0 {
			n, err := s.NextReplicaIDs(w.Service, 1)
			w.outcome("next replica id", err, func() { id = n; w.ids = append(w.ids, int64(n)) })
			continue
		}
		rec := replicas.Record{Service: w.Service, ID: id, Version: 1, Status: []replicas.Status{replicas.StatusProvisioning,
			replicas.StatusStarting, replicas.StatusReady, replicas.StatusNotReady}[k%4], Reason: fmt.Sprintf("%s-%d-%d", w.Name, owner, k)}
		w.outcome("save replica", s.SaveReplica(rec), func() { w.records[id] = rec })
	}
	if id < 0 || owner%3 != 0 {
		return
	}
	for range 2 {
		w.outcome("delete replica", s.DeleteReplica(w.Service, id), func() { delete(w.records, id) })
	}
}

// Unexpected fails t with every write that failed with an error the set does not allow.
func (w *Writers) Unexpected(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := errors.Join(w.unexpected...); err != nil {
		t.Errorf("writes that failed unexpectedly:\n%v", err)
	}
}

// CheckState wants s to hold what the sets wrote, nothing lost: every replica record as its
// last successful save left it (none that was deleted), every leftover put and not forgotten,
// every version recorded; the service's status, target and rollout are the last write of one
// of the sets (they wrote them concurrently); no replica id handed out twice.
func CheckState(t *testing.T, s store.Store, sets ...*Writers) {
	t.Helper()
	var (
		wantRecords                   []replicas.Record
		ids                           []int64
		statuses                      = map[string]bool{}
		targets                       = map[int]bool{}
		rollouts                      []replicas.Rollout
		wantVersions                  = []int{1}
		wantLeftovers, otherLeftovers []string
	)
	for _, w := range sets {
		w.mu.Lock()
		for _, r := range w.records {
			wantRecords = append(wantRecords, r)
		}
		ids = append(ids, w.ids...)
		if n := len(w.status); n > 0 {
			statuses[w.status[n-1]] = true
		}
		if n := len(w.targets); n > 0 {
			targets[w.targets[n-1]] = true
		}
		if n := len(w.rollouts); n > 0 {
			rollouts = append(rollouts, w.rollouts[n-1])
		}
		wantVersions = append(wantVersions, w.started...)
		for key := range w.leftovers {
			wantLeftovers = append(wantLeftovers, key)
		}
		w.mu.Unlock()
	}
	checkUnique(t, ids)
	slices.SortFunc(wantRecords, func(a, b replicas.Record) int { return a.ID - b.ID })
	got, err := s.ListReplicas(sets[0].Service)
	must(t, err)
	if diff := cmp.Diff(wantRecords, got); diff != "" {
		t.Errorf("replica records (-want +got): a save that succeeded was lost, or a deleted record came back:\n%s", diff)
	}
	svc, err := s.GetService(sets[0].Service)
	must(t, err)
	if !statuses[svc.Status] || !targets[svc.Target] {
		t.Errorf("service status %q, target %d: want one set's last write, of %v and %v", svc.Status, svc.Target, statuses, targets)
	}
	checkRollout(t, s, sets[0].Service, svc, rollouts, wantVersions)
	for _, l := range listLeftovers(t, s) {
		if strings.HasPrefix(l.Key, sets[0].Service+"-") {
			otherLeftovers = append(otherLeftovers, l.Key)
		}
	}
	slices.Sort(wantLeftovers)
	if diff := cmp.Diff(wantLeftovers, otherLeftovers); diff != "" {
		t.Errorf("leftovers (-want +got):\n%s", diff)
	}
}

func checkRollout(t *testing.T, s store.Store, service string, svc store.Service, want []replicas.Rollout, wantVersions []int) {
	t.Helper()
	r, err := s.Rollout(service)
	must(t, err)
	if len(want) == 0 {
		if r != nil {
			t.Errorf("rollout %+v, want none", r)
		}
	} else if r == nil || !slices.ContainsFunc(want, func(w replicas.Rollout) bool { return cmp.Equal(w, *r) }) {
		t.Errorf("rollout %+v: want one set's last, of %+v", r, want)
	} else if svc.Version != r.Target() {
		t.Errorf("service at version %d, its rollout's target %d", svc.Version, r.Target())
	}
	vs, err := s.Versions(service)
	must(t, err)
	var got []int
	for _, v := range vs {
		got = append(got, v.Number)
	}
	slices.Sort(wantVersions)
	if diff := cmp.Diff(wantVersions, got); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
}

func checkUnique(t *testing.T, ids []int64) {
	t.Helper()
	seen := map[int64]bool{}
	for _, id := range ids {
		if seen[id] {
			t.Errorf("replica id %d handed out twice: %v", id, ids)
		}
		seen[id] = true
	}
}

// CheckGone wants s to hold nothing of service: no row, replica, version or rollout.
func CheckGone(t *testing.T, s store.Store, service string) {
	t.Helper()
	if svc, err := s.GetService(service); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetService after DeleteService: %+v, %v; want ErrNotFound", svc, err)
	}
	if got, err := s.ListReplicas(service); err != nil || len(got) != 0 {
		t.Errorf("replica records left after DeleteService: %+v, %v", got, err)
	}
	if vs, err := s.Versions(service); err != nil || len(vs) != 0 {
		t.Errorf("versions left after DeleteService: %d, %v", len(vs), err)
	}
	if r, err := s.Rollout(service); err != nil || r != nil {
		t.Errorf("rollout left after DeleteService: %+v, %v", r, err)
	}
}

// NotFound allows the errors of writes to a service deleted meanwhile.
func NotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// testRacingWritesAndDeletes: two stores on the same state (two controllers) write one service
// at once, many goroutines each; nothing may be lost. Then, while both still write, one deletes
// the service: the delete succeeds, the writes that come after it fail with ErrNotFound (or
// succeed, for SetTarget and leftovers), and nothing of the service is left behind.
func testRacingWritesAndDeletes(t *testing.T, open Opener) {
	a, b := open(t), open(t)
	must(t, a.CreateService(store.Service{Name: "race", Version: 1, Task: &configs.Task{Run: "serve v1"}, Port: 1, Status: "INIT"}))
	wa := &Writers{Service: "race", Name: "a", Owners: 3, Ops: 6, Versions: []int{2, 4}}
	wb := &Writers{Service: "race", Name: "b", Owners: 3, Ops: 6, Versions: []int{3, 5}}
	da, db := wa.Start(a), wb.Start(b)
	<-da
	<-db
	wa.Unexpected(t)
	wb.Unexpected(t)
	CheckState(t, open(t), wa, wb) // what a restarted controller reads

	deleted := make(chan struct{})
	wa2 := &Writers{Service: "race", Name: "a2", Owners: 3, Ops: 6, Versions: []int{6, 8}, Allowed: NotFound, Until: deleted}
	wb2 := &Writers{Service: "race", Name: "b2", Owners: 3, Ops: 6, Versions: []int{7, 9}, Allowed: NotFound, Until: deleted}
	da, db = wa2.Start(a), wb2.Start(b)
	<-wa2.After(6)
	must(t, a.DeleteService("race"))
	close(deleted)
	<-da
	<-db
	wa2.Unexpected(t)
	wb2.Unexpected(t)
	CheckGone(t, open(t), "race")
	must(t, b.DeleteService("race")) // gone already: success
}

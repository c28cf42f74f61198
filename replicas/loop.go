package replicas

import (
	"context"
	"fmt"
	"runtime/debug"
)

// One goroutine owns the manager's state (replicas, instances, rollout, queues; every field
// documented as state in Manager), in the style of etcd raft's node.run: while Start runs, the
// run loop does, and every input — a desired count, a probe result, a List, a launch or
// terminate completion, a notice, an update, the first read of the records — reaches the
// state as a step posted to it and run there, one at a time. Steps are short and never block: provider calls
// run in their own goroutines and post their completions back as steps, store writes and
// publications go to the executor (records.go), and a pass that must write before it acts
// (reconcile.go) posts one step per round from its own goroutine. Readers load the snapshot
// each step republishes (snapshot.go).
//
// A method whose name ends in Owned runs as the state's owner, inside a step: it reads and
// writes the state freely, must not block, and must not post a step itself.
//
// When no loop runs (before Start, after it returned, in a Shutdown without Start) the turn —
// a token only the loop holds while it runs — passes each step to one caller at a time, so the
// state still has exactly one owner at any moment.

// run is the run loop: it holds the turn and runs posted steps until ctx ends.
func (m *Manager) run(ctx context.Context) {
	select {
	case <-m.turn: // a caller owning the state right now finishes its step first
	case <-ctx.Done():
		return
	}
	defer func() { m.turn <- struct{}{} }()
	for {
		select {
		case <-ctx.Done():
			return
		case step := <-m.steps:
			step()
		}
	}
}

// own runs fn as the state's owner — on the run loop, or in the caller when no loop runs — and
// returns once it ran. fn must not call own (the loop would wait for itself) nor block. A panic
// in fn is raised again in the caller, with the stack where fn failed, so that the loop goes
// on; every goroutine that calls own recovers (recoverPanic) and logs it.
func (m *Manager) own(fn func()) {
	done := make(chan struct{})
	var p any
	step := func() {
		defer func() {
			if r := recover(); r != nil {
				p = fmt.Sprintf("%v\n(in a step of the run loop)\n%s", r, debug.Stack())
			}
			close(done)
		}()
		fn()
	}
	select {
	case m.steps <- step:
	case <-m.turn:
		step()
		m.turn <- struct{}{}
	}
	<-done
	if p != nil {
		panic(p)
	}
}

// step runs fn as the owner, like own, and republishes the snapshot for readers: for steps
// that may change what readers see.
func (m *Manager) step(fn func()) {
	m.own(func() {
		fn()
		m.snap.Store(m.snapshotOwned())
	})
}

// do runs fn as the owner, like step, then returns once the effects fn queued ran (records.go):
// the records it changed are on disk, the launches it decided started. When fn queued none it
// returns at once: it does not wait for others' (a pass that changed nothing would wait behind
// every write queued before it). Every step that may queue an effect is a do, so no effect
// waits for somebody else's do to run. An effect must use step or own, never do: it would wait
// for itself.
func (m *Manager) do(fn func()) {
	var done chan struct{}
	m.step(func() {
		queued := len(m.effects)
		fn()
		if len(m.effects) > queued { // only fn's: a notice offered to every service waits on none of theirs
			done = make(chan struct{})
			m.queueAfterOwned(func() { close(done) })
		}
	})
	if done == nil {
		return
	}
	m.flush()
	<-done // another caller may be running the queue: it runs ours too
}

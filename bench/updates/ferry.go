package main

import (
	"github.com/ferryserve/ferry/bench/servicekit"
)

// instance is a local replica's instance, as the leak checks see it.
type instance = servicekit.Instance

// version is the version the instance was launched as (its ferry.version label).
func version(in instance) int { return in.IntLabel("ferry.version") }

// liveInstances is every seen instance whose process group still has a process, by id.
func liveInstances(f *servicekit.Ferry) []instance {
	var live []instance
	for _, in := range f.SeenInstances() {
		if len(servicekit.GroupMembers(in.PGID)) > 0 {
			live = append(live, in)
		}
	}
	return live
}

// countByVersion counts instances per launched-as version.
func countByVersion(ins []instance) map[int]int {
	out := map[int]int{}
	for _, in := range ins {
		out[version(in)]++
	}
	return out
}

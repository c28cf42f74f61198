package autoscaler

import (
	"testing"

	"github.com/ferryserve/ferry/configs"
)

func TestFixed(t *testing.T) {
	tests := map[string]struct {
		policy configs.ReplicaPolicy
		want   int
	}{
		"fixed two":               {configs.ReplicaPolicy{MinReplicas: 2, MaxReplicas: 2}, 2},
		"range holds min":         {configs.ReplicaPolicy{MinReplicas: 1, MaxReplicas: 5}, 1},
		"scale to zero keeps one": {configs.ReplicaPolicy{MinReplicas: 0, MaxReplicas: 3}, 1},
		"zero means zero":         {configs.ReplicaPolicy{MinReplicas: 0, MaxReplicas: 0}, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Fixed(tc.policy); got != tc.want {
				t.Errorf("Fixed(%+v) = %d, want %d", tc.policy, got, tc.want)
			}
		})
	}
}

package attach

import (
	"encoding/json"
	"testing"

	"github.com/ferryserve/ferry/proxy"
)

// TestWireNames pins the JSON on the wire: proxies and controllers of different builds talk
// to each other, so a renamed field would silently drop a value.
func TestWireNames(t *testing.T) {
	tests := map[string]struct {
		v    any
		want string
	}{
		"replica set": {
			v: ReplicaSet{Service: "llama", Seq: 7, Backends: []proxy.Backend{{ID: 1, Addr: "10.0.0.1:8080", Accelerator: "L4", Version: 2},
				{ID: 2, Addr: "10.0.0.2:8080", Version: 2}}, Config: ProxyConfig{Policy: "round_robin", AuthRequired: true}},
			want: `{"service":"llama","seq":7,"backends":[{"id":1,"addr":"10.0.0.1:8080","accelerator":"L4","version":2},` +
				`{"id":2,"addr":"10.0.0.2:8080","version":2}],"config":{"load_balancing_policy":"round_robin","auth_required":true}}`,
		},
		"load report": {
			v:    LoadReport{ProxyID: "p1", Seq: 7, InFlight: map[string]int64{"10.0.0.1:8080": 3}, Arrivals: 10, Waiting: 1},
			want: `{"proxy_id":"p1","seq":7,"in_flight":{"10.0.0.1:8080":3},"arrivals":10,"waiting":1}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got  %s\nwant %s", b, tc.want)
			}
		})
	}
}

package main

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/internal/controller"
)

// TestKubeAPIRateFlags checks that --kube-api-qps and --kube-api-burst, and their environment
// variables, land in the store options every controller client is made from.
func TestKubeAPIRateFlags(t *testing.T) {
	tests := map[string]struct {
		env       map[string]string
		args      []string
		wantQPS   float32
		wantBurst int
		wantErr   string
	}{
		"unset":       {},
		"flags":       {args: []string{"--kube-api-qps=350.5", "--kube-api-burst=700"}, wantQPS: 350.5, wantBurst: 700},
		"environment": {env: map[string]string{"FERRY_KUBE_API_QPS": "-1", "FERRY_KUBE_API_BURST": "20"}, wantQPS: -1, wantBurst: 20},
		"bad env":     {env: map[string]string{"FERRY_KUBE_API_QPS": "fast"}, wantErr: "$FERRY_KUBE_API_QPS"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var (
				o    controller.StoreOptions
				errs []error
			)
			f := pflag.NewFlagSet("controller", pflag.ContinueOnError)
			addStoreFlags(f, &o, &errs)
			if err := f.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" {
				if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.wantErr) {
					t.Fatalf("errors %v, want one naming %s", errs, tc.wantErr)
				}
				return
			}
			if len(errs) > 0 || o.QPS != tc.wantQPS || o.Burst != tc.wantBurst {
				t.Errorf("QPS %v burst %d errors %v; want %v, %d, none", o.QPS, o.Burst, errs, tc.wantQPS, tc.wantBurst)
			}
		})
	}
}

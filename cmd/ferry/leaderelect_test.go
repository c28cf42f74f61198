package main

import (
	"testing"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/controller"
)

func TestAdvertiseURL(t *testing.T) {
	t.Setenv("POD_IP", "10.1.2.3")
	tests := map[string]struct {
		explicit, listen string
		tls              bool
		want             string
		wantErr          bool
	}{
		"from listen":         {listen: "127.0.0.1:8787", want: "http://127.0.0.1:8787"},
		"tls":                 {listen: "127.0.0.1:8787", tls: true, want: "https://127.0.0.1:8787"},
		"unspecified: pod ip": {listen: "0.0.0.0:8787", want: "http://10.1.2.3:8787"},
		"ipv6 unspecified":    {listen: "[::]:8787", want: "http://10.1.2.3:8787"},
		"explicit wins":       {explicit: "https://ferry-0.ferry:8787/", listen: "0.0.0.0:8787", want: "https://ferry-0.ferry:8787"},
		"explicit, no scheme": {explicit: "ferry-0:8787", wantErr: true},
		"no listen":           {wantErr: true},
		"listen off":          {listen: "off", wantErr: true},
		"listen without port": {listen: "127.0.0.1", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := advertiseURL(tc.explicit, tc.listen, tc.tls)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("advertiseURL = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestLeaderElectNeedsTheKubernetesStore(t *testing.T) {
	opts := controller.Options{Listen: "127.0.0.1:8787", Store: controller.StoreOptions{Kind: controller.StoreSQLite}}
	if err := (electionFlags{enabled: true}).apply(&opts, zap.NewNop()); err == nil {
		t.Fatal("--leader-elect with --store sqlite accepted")
	}
	if err := (electionFlags{}).apply(&opts, zap.NewNop()); err != nil || opts.Elector != nil {
		t.Fatalf("without --leader-elect: %v, elector %v", err, opts.Elector)
	}
}

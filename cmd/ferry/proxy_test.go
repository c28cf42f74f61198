package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/proxy"
)

func TestProxyFlags(t *testing.T) {
	const key = "sk-ferry-flags-0123456789"
	t.Setenv("FERRY_TEST_KEY", key)
	t.Setenv("FERRY_SHORT_KEY", "short")
	const metricsToken = "metrics-token-in-a-file-0123"
	tokenFile, shortTokenFile := filepath.Join(t.TempDir(), "token"), filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(tokenFile, []byte(metricsToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shortTokenFile, []byte("tiny-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := proxyFlags{listen: "127.0.0.1:8000", name: "svc", policy: "least_load", replicas: []string{"127.0.0.1:9001"},
		maxBodyMB: 32, idleTimeout: time.Minute, maxBufferedMB: 512}
	tests := map[string]struct {
		edit    func(*proxyFlags)
		check   func(*testing.T, proxyOptions)
		wantErr string
	}{
		"defaults": {check: func(t *testing.T, o proxyOptions) {
			if o.service.APIKeyHashes != nil || o.service.TLS != nil || o.service.MaxRequestBodySize != 32<<20 {
				t.Errorf("service config %+v", o.service)
			}
			if o.metricsListen != "" || o.accessLog {
				t.Errorf("metrics or access log on by default: %q, %v", o.metricsListen, o.accessLog)
			}
		}},
		"api key from env": {
			edit: func(f *proxyFlags) { f.apiKeyEnvs = []string{"FERRY_TEST_KEY"} },
			check: func(t *testing.T, o proxyOptions) {
				if len(o.service.APIKeyHashes) != 1 || o.service.APIKeyHashes[0] != configs.HashAPIKey(key) {
					t.Errorf("hashes %v", o.service.APIKeyHashes)
				}
			},
		},
		"unset key variable": {edit: func(f *proxyFlags) { f.apiKeyEnvs = []string{"FERRY_NOPE"} }, wantErr: "--api-key-env FERRY_NOPE: the variable is not set"},
		"short key":          {edit: func(f *proxyFlags) { f.apiKeyEnvs = []string{"FERRY_SHORT_KEY"} }, wantErr: "at least 16"},
		"cert without key":   {edit: func(f *proxyFlags) { f.tlsCert = "c.pem" }, wantErr: "--tls-cert and --tls-key go together"},
		"missing cert files": {edit: func(f *proxyFlags) { f.tlsCert, f.tlsKey = "/nonexistent/c.pem", "/nonexistent/k.pem" }, wantErr: "/nonexistent/c.pem"},
		"negative cap":       {edit: func(f *proxyFlags) { f.maxConcurrent = -1 }, wantErr: "--max-concurrent-requests -1"},
		"huge body":          {edit: func(f *proxyFlags) { f.maxBodyMB = 4096 }, wantErr: "--max-body-mb 4096"},
		"zero idle timeout":  {edit: func(f *proxyFlags) { f.idleTimeout = 0 }, wantErr: "--idle-timeout 0s"},
		"metrics and access log": {
			edit: func(f *proxyFlags) { f.metricsListen, f.accessLog = "127.0.0.1:9464", true },
			check: func(t *testing.T, o proxyOptions) {
				if o.metricsListen != "127.0.0.1:9464" || !o.accessLog {
					t.Errorf("metricsListen %q, accessLog %v", o.metricsListen, o.accessLog)
				}
			},
		},
		"attach": {
			edit: func(f *proxyFlags) { f.replicas, f.attach, f.tlsCert, f.tlsKey = nil, "llama", "", "" },
			check: func(t *testing.T, o proxyOptions) {
				if o.attach != "llama" || o.service.Name != "llama" || len(o.backends) != 0 {
					t.Errorf("attach %q, name %q, backends %v", o.attach, o.service.Name, o.backends)
				}
			},
		},
		"attach with a replica": {edit: func(f *proxyFlags) { f.attach = "llama" }, wantErr: "--replica does not go with --attach"},
		"attach to several controllers": {
			edit: func(f *proxyFlags) {
				f.replicas, f.attach, f.tlsCert, f.tlsKey, f.controllers = nil, "llama", "", "", []string{"http://10.0.0.1:8787", "https://ferry.svc:8787"}
			},
			check: func(t *testing.T, o proxyOptions) {
				if len(o.controllers) != 2 || o.controllers[1] != "https://ferry.svc:8787" {
					t.Errorf("controllers %v", o.controllers)
				}
			},
		},
		"controller without a scheme": {
			edit:    func(f *proxyFlags) { f.replicas, f.attach, f.controllers = nil, "llama", []string{"10.0.0.1:8787"} },
			wantErr: `--controller "10.0.0.1:8787": want http://HOST:PORT`,
		},
		"controller without attach": {edit: func(f *proxyFlags) { f.controllers = []string{"http://10.0.0.1:8787"} }, wantErr: "--controller goes with --attach or --attach-all"},
		"attach all": {
			edit: func(f *proxyFlags) {
				f.replicas, f.attachAll, f.tlsCert, f.tlsKey, f.controllers = nil, true, "", "", []string{"https://ferry.svc:8787"}
			},
			check: func(t *testing.T, o proxyOptions) {
				if !o.attachAll || o.attach != "" || len(o.backends) != 0 || len(o.controllers) != 1 {
					t.Errorf("attachAll %v, attach %q, backends %v, controllers %v", o.attachAll, o.attach, o.backends, o.controllers)
				}
			},
		},
		"attach all and one":          {edit: func(f *proxyFlags) { f.replicas, f.attach, f.attachAll = nil, "llama", true }, wantErr: "--attach and --attach-all"},
		"attach all with a replica":   {edit: func(f *proxyFlags) { f.attachAll = true }, wantErr: "--replica does not go with --attach-all"},
		"attach all with a name flag": {edit: func(f *proxyFlags) { f.replicas, f.attachAll, f.set = nil, true, map[string]bool{"name": true} }, wantErr: "--name does not go with --attach-all"},
		"attach with a policy flag": {
			edit:    func(f *proxyFlags) { f.replicas, f.attach, f.set = nil, "llama", map[string]bool{"policy": true} },
			wantErr: "--policy does not go with --attach",
		},
		"attach with a key": {
			edit:    func(f *proxyFlags) { f.replicas, f.attach, f.apiKeyEnvs = nil, "llama", []string{"FERRY_TEST_KEY"} },
			wantErr: "--api-key-env does not go with --attach",
		},
		"metrics token": {
			edit: func(f *proxyFlags) { f.metricsListen, f.metricsTokenFile = "127.0.0.1:9464", tokenFile },
			check: func(t *testing.T, o proxyOptions) {
				if o.metricsToken != metricsToken {
					t.Errorf("metrics token %q, want the file's, trimmed", o.metricsToken)
				}
			},
		},
		"metrics token without metrics": {edit: func(f *proxyFlags) { f.metricsTokenFile = tokenFile }, wantErr: "--metrics-token-file: goes with --metrics-listen"},
		"short metrics token": {
			edit:    func(f *proxyFlags) { f.metricsListen, f.metricsTokenFile = "127.0.0.1:9464", shortTokenFile },
			wantErr: "is 11 characters; want at least 16",
		},
		"missing metrics token file": {
			edit:    func(f *proxyFlags) { f.metricsListen, f.metricsTokenFile = "127.0.0.1:9464", "/nonexistent/token" },
			wantErr: "--metrics-token-file: stat /nonexistent/token",
		},
		"stream and rate limits": {
			edit: func(f *proxyFlags) { f.maxStreams, f.rateLimit, f.rateBurst = 4, 2.5, 10 },
			check: func(t *testing.T, o proxyOptions) {
				if o.service.MaxConcurrentStreams != 4 || o.service.RateLimit != (proxy.RateLimit{RequestsPerSecond: 2.5, Burst: 10}) {
					t.Errorf("streams %d, rate %+v", o.service.MaxConcurrentStreams, o.service.RateLimit)
				}
			},
		},
		"negative streams": {edit: func(f *proxyFlags) { f.maxStreams = -1 }, wantErr: "--max-concurrent-streams -1"},
		"connection caps": {
			edit: func(f *proxyFlags) { f.maxConns, f.maxConnsPerIP, f.maxBufferedMB = 500, 20, 64 },
			check: func(t *testing.T, o proxyOptions) {
				if o.clientLimits != (proxy.ClientLimits{MaxConnections: 500, MaxConnectionsPerAddr: 20, MaxBufferedBodyBytes: 64 << 20}) {
					t.Errorf("client limits %+v", o.clientLimits)
				}
			},
		},
		"per-address cap off": {
			edit: func(f *proxyFlags) { f.maxConnsPerIP = -1 },
			check: func(t *testing.T, o proxyOptions) {
				if o.clientLimits.MaxConnectionsPerAddr != proxy.NoConnectionCapPerAddr {
					t.Errorf("client limits %+v", o.clientLimits)
				}
			},
		},
		"negative connection caps":       {edit: func(f *proxyFlags) { f.maxConns, f.maxConnsPerIP = -1, -2 }, wantErr: "--max-connections-per-ip -2"},
		"no body budget":                 {edit: func(f *proxyFlags) { f.maxBufferedMB = -1 }, wantErr: "--max-buffered-body-mb -1"},
		"rate too slow":                  {edit: func(f *proxyFlags) { f.rateLimit = 0.0001 }, wantErr: "--rate-limit 0.0001"},
		"burst without rate":             {edit: func(f *proxyFlags) { f.rateBurst = 3 }, wantErr: "--rate-limit-burst: goes with --rate-limit"},
		"attach with rate limit":         {edit: func(f *proxyFlags) { f.replicas, f.attach, f.set = nil, "llama", map[string]bool{"rate-limit": true} }, wantErr: "--rate-limit does not go with --attach"},
		"metrics port missing":           {edit: func(f *proxyFlags) { f.metricsListen = "127.0.0.1" }, wantErr: `--metrics-listen "127.0.0.1"`},
		"metrics on the traffic address": {edit: func(f *proxyFlags) { f.metricsListen = f.listen }, wantErr: "must differ from --listen"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := base
			if tc.edit != nil {
				tc.edit(&f)
			}
			opts, err := f.parse()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parse error = %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "short") && strings.Contains(err.Error(), "=short") || strings.Contains(err.Error(), "tiny-secret") {
					t.Errorf("error shows the key or token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, err := proxy.NewService(opts.service); err != nil {
				t.Fatalf("the parsed config is rejected: %v", err)
			}
			tc.check(t, opts)
		})
	}
}

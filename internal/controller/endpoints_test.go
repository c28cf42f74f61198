package controller

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEndpointOptionsParse reads --service-endpoints-via and the HTTPRoute flags, and refuses
// each bad value naming its flag and what it wants.
func TestEndpointOptionsParse(t *testing.T) {
	tests := map[string]struct {
		opts          EndpointOptions
		wantShared    string
		wantExternal  string // the proxies' DNS name, as an ExternalName names it
		wantParents   []any
		wantErr       []string
		wantNilTarget bool
	}{
		"off":                {wantNilTarget: true},
		"name and port":      {opts: EndpointOptions{Via: "ferry-proxy:80"}, wantShared: "http://ferry-proxy.ferry.svc:80", wantExternal: "ferry-proxy.ferry.svc.cluster.local"},
		"namespace, https":   {opts: EndpointOptions{Via: "https://gw.edge:8443"}, wantShared: "https://gw.edge.svc:8443", wantExternal: "gw.edge.svc.cluster.local"},
		"cluster domain":     {opts: EndpointOptions{Via: "gw.edge.svc.corp.internal:80"}, wantShared: "http://gw.edge.svc:80", wantExternal: "gw.edge.svc.corp.internal"},
		"no port":            {opts: EndpointOptions{Via: "ferry-proxy"}, wantErr: []string{"--service-endpoints-via", "NAME[.NAMESPACE]:PORT"}},
		"bad port":           {opts: EndpointOptions{Via: "ferry-proxy:0"}, wantErr: []string{`port "0": want 1 to 65535`}},
		"bad scheme":         {opts: EndpointOptions{Via: "tcp://ferry-proxy:80"}, wantErr: []string{`scheme "tcp"`}},
		"not svc":            {opts: EndpointOptions{Via: "a.b.c.d:80"}, wantErr: []string{"NAME.NAMESPACE.svc.CLUSTER_DOMAIN"}},
		"bad name":           {opts: EndpointOptions{Via: "Ferry_Proxy:80"}, wantErr: []string{`"Ferry_Proxy"`}},
		"routes without via": {opts: EndpointOptions{RouteParents: []string{"name=gw"}}, wantErr: []string{"need --service-endpoints-via"}},
		"route": {opts: EndpointOptions{Via: "p:80", RouteParents: []string{"name=gw,namespace=infra,port=443", "name=other,sectionName=web"}, RouteHostname: "{name}.example.com"},
			wantShared: "http://p.ferry.svc:80", wantExternal: "p.ferry.svc.cluster.local",
			wantParents: []any{map[string]any{"name": "gw", "namespace": "infra", "port": int64(443)}, map[string]any{"name": "other", "sectionName": "web"}}},
		"parent without name":   {opts: EndpointOptions{Via: "p:80", RouteParents: []string{"namespace=infra"}, RouteHostname: "{name}.x"}, wantErr: []string{"name= is required"}},
		"parent unknown key":    {opts: EndpointOptions{Via: "p:80", RouteParents: []string{"name=gw,host=x"}, RouteHostname: "{name}.x"}, wantErr: []string{`"host": want one of`}},
		"parent twice":          {opts: EndpointOptions{Via: "p:80", RouteParents: []string{"name=gw,name=x"}, RouteHostname: "{name}.x"}, wantErr: []string{"name given twice"}},
		"hostname without name": {opts: EndpointOptions{Via: "p:80", RouteParents: []string{"name=gw"}, RouteHostname: "llm.example.com"}, wantErr: []string{"--service-httproute-hostname", "holding {name}"}},
		"hostname not DNS":      {opts: EndpointOptions{Via: "p:80", RouteParents: []string{"name=gw"}, RouteHostname: "{name}_x.example.com"}, wantErr: []string{"not a DNS name"}},
		"hostname alone":        {opts: EndpointOptions{Via: "p:80", RouteHostname: "{name}.example.com"}, wantErr: []string{"set --service-httproute-parent too"}},
		"every error at once": {opts: EndpointOptions{Via: "p", RouteParents: []string{"x=y"}, RouteHostname: "h"},
			wantErr: []string{"--service-endpoints-via", `"x": want one of`, "holding {name}"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := tc.opts.parse("ferry")
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, want one saying %q", tc.wantErr)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantNilTarget {
				if got != nil {
					t.Errorf("target %+v with no --service-endpoints-via", got)
				}
				return
			}
			external := got.proxies + "." + got.proxiesNamespace + ".svc." + got.domain
			if got.sharedEndpoint() != tc.wantShared || external != tc.wantExternal {
				t.Errorf("shared endpoint %q, proxies' DNS name %q; want %q, %q", got.sharedEndpoint(), external, tc.wantShared, tc.wantExternal)
			}
			if diff := cmp.Diff(tc.wantParents, got.parents); diff != "" {
				t.Errorf("parentRefs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestContains: the API server's defaults in a live object do not count as a difference, a
// changed or missing value does.
func TestContains(t *testing.T) {
	live := map[string]any{"rules": []any{map[string]any{"backendRefs": []any{map[string]any{"name": "chat", "port": int64(80), "kind": "Service", "weight": int64(1)}},
		"matches": []any{map[string]any{"path": map[string]any{"type": "PathPrefix", "value": "/"}}}}}}
	tests := map[string]struct {
		want any
		ok   bool
	}{
		"subset":        {want: map[string]any{"rules": []any{map[string]any{"backendRefs": []any{map[string]any{"name": "chat", "port": int64(80)}}}}}, ok: true},
		"other port":    {want: map[string]any{"rules": []any{map[string]any{"backendRefs": []any{map[string]any{"name": "chat", "port": int64(81)}}}}}},
		"more backends": {want: map[string]any{"rules": []any{map[string]any{"backendRefs": []any{map[string]any{"name": "chat"}, map[string]any{"name": "x"}}}}}},
		"missing key":   {want: map[string]any{"hostnames": []any{"a"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := contains(live, tc.want); got != tc.ok {
				t.Errorf("contains = %v, want %v", got, tc.ok)
			}
		})
	}
}

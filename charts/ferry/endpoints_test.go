package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartServiceEndpoints: proxies that front every service give each FerryService a Service
// of its own (the controller's --service-endpoints-via, over https with the proxies' TLS) and
// the controller the right to keep Services, and with proxy.httpRoute.parentRefs HTTPRoutes
// too; proxies of one service, proxy.serviceEndpoints=false or the SQLite store (which follows
// no FerryServices) render neither flag nor rule; parentRefs without the endpoints, or without
// a hostname holding {name}, are a render error naming the value.
func TestChartServiceEndpoints(t *testing.T) {
	routeValues := []string{"proxy.attach=*", "proxy.httpRoute.parentRefs[0].name=public", "proxy.httpRoute.parentRefs[0].namespace=gateways",
		"proxy.httpRoute.parentRefs[0].sectionName=https", "proxy.httpRoute.parentRefs[1].name=internal", "proxy.httpRoute.parentRefs[1].port=8443"}
	tests := map[string]struct {
		set        []string
		wantArgs   []string
		wantRules  []string // the state Role's resources beyond the rest
		wantRender string   // a render error saying this
	}{
		"one service":   {set: []string{"proxy.attach=llama"}},
		"every service": {set: []string{"proxy.attach=*"}, wantArgs: []string{"--service-endpoints-via=ferry-proxy:80"}, wantRules: []string{"services"}},
		"tls and port": {set: []string{"proxy.attach=*", "tls.proxy.secretName=px", "proxy.service.port=443"},
			wantArgs: []string{"--service-endpoints-via=https://ferry-proxy:443"}, wantRules: []string{"services"}},
		"turned off": {set: []string{"proxy.attach=*", "proxy.serviceEndpoints=false"}},
		"sqlite":     {set: []string{"proxy.attach=*", "controller.store=sqlite", "controller.replicas=1", "controller.leaderElect=false"}},
		"routes": {set: append(slices.Clone(routeValues), jsonValue+`proxy.httpRoute.hostname="{name}.llm.example.com"`),
			wantArgs: []string{"--service-endpoints-via=ferry-proxy:80", "--service-httproute-parent=name=public,namespace=gateways,sectionName=https",
				"--service-httproute-parent=name=internal,port=8443", "--service-httproute-hostname={name}.llm.example.com"},
			wantRules: []string{"services", "httproutes"}},
		"routes without a hostname": {set: routeValues, wantRender: "proxy.httpRoute.hostname"},
		"routes without endpoints": {set: append([]string{"proxy.serviceEndpoints=false"}, append(slices.Clone(routeValues), jsonValue+`proxy.httpRoute.hostname="{name}.x"`)...),
			wantRender: "proxy.httpRoute.parentRefs: HTTPRoutes lead to FerryServices' own Services"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.wantRender != "" {
				_, err := runHelm(t, append([]string{"template", "ferry", chartDir, "--namespace", "ferry", "--kube-version", kubeVersion}, setArgs(tc.set)...)...)
				if err == nil || !strings.Contains(err.Error(), tc.wantRender) {
					t.Fatalf("helm template: %v, want an error saying %q", err, tc.wantRender)
				}
				return
			}
			var ctl, role *unstructured.Unstructured
			for _, o := range render(t, "ferry", kubeVersion, tc.set) {
				switch o.GetKind() + "/" + o.GetName() {
				case "Deployment/ferry-controller":
					ctl = o
				case "Role/ferry-state":
					role = o
				}
			}
			var gotArgs []string
			for _, a := range containerArgs(t, ctl) {
				if strings.HasPrefix(a, "--service-") {
					gotArgs = append(gotArgs, a)
				}
			}
			if diff := cmp.Diff(tc.wantArgs, gotArgs); diff != "" {
				t.Errorf("controller args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantRules, endpointRules(t, role)); diff != "" {
				t.Errorf("the state Role's rules on Services and HTTPRoutes (-want +got):\n%s", diff)
			}
		})
	}
}

// endpointRules are the resources among services and httproutes that role grants, each
// checked to be exactly what the controller does with them.
func endpointRules(t *testing.T, role *unstructured.Unstructured) []string {
	t.Helper()
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	var got []string
	for _, r := range rules {
		resources, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
		verbs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs")
		groups, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
		for _, res := range resources {
			if res != "services" && res != "httproutes" {
				continue
			}
			got = append(got, res)
			wantGroup := map[string]string{"services": "", "httproutes": "gateway.networking.k8s.io"}[res]
			if !slices.Equal(verbs, []string{"get", "list", "watch", "create", "update", "delete"}) || !slices.Equal(groups, []string{wantGroup}) {
				t.Errorf("%s granted %v in %v, want get list watch create update delete in %q", res, verbs, groups, wantGroup)
			}
		}
	}
	return got
}

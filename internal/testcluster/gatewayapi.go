package testcluster

import (
	"context"
	_ "embed"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

var httpRouteGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}

// httpRouteCRD is the Gateway API's own HTTPRoute CRD, standard channel (the file's header
// says which release, and its licence).
//
//go:embed crds/httproutes.yaml
var httpRouteCRD []byte

// InstallHTTPRouteCRD installs the Gateway API's HTTPRoute CRD (crds/httproutes.yaml) and waits
// until the API server serves it, for tests of what Ferry keeps where the Gateway API is
// installed. No Gateway controller runs: the routes are checked against the schema, never
// served. Installing it twice is not an error; it stays for the rest of the test binary.
func (c *Cluster) InstallHTTPRouteCRD(ctx context.Context) error {
	return c.installCRD(ctx, httpRouteCRD, httpRouteGVR)
}

package main

import (
	"context"

	"github.com/ferryserve/ferry/internal/api"
)

// exampleModel is the model `serve up` puts in its example request. It is asked of the
// endpoint only when a replica is READY: a request to a service with none is load, and would
// launch the first replica of a service that starts with none, as SkyServe starts one with
// min_replicas: 0. zero says the service has no replica yet.
func exampleModel(ctx context.Context, c *api.Client, name, endpoint, authorization string) (model string, zero bool) {
	list, err := c.Services(ctx, name)
	if err != nil || len(list) == 0 || list[0].ReadyReplicas == 0 {
		return "MODEL", err == nil && len(list) > 0 && list[0].TargetReplicas == 0
	}
	return servedModel(ctx, endpoint, authorization), false
}

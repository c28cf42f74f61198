package attach

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/ferryserve/ferry/internal/api"
)

// PollReplicaSet long-polls a service's replica set: it returns at once when the controller's
// Seq differs from after (pass 0 for the current set), else when the set changes or after wait
// (at most MaxPollWait; 0 answers at once with the current set). Cancel ctx to give up.
func PollReplicaSet(ctx context.Context, c *api.Client, service string, after uint64, wait time.Duration) (ReplicaSet, error) {
	q := url.Values{}
	q.Set("after", strconv.FormatUint(after, 10))
	q.Set("wait", strconv.FormatFloat(max(wait, 0).Seconds(), 'f', -1, 64))
	var rs ReplicaSet
	err := c.Do(ctx, http.MethodGet, "/v1/services/"+url.PathEscape(service)+"/replicaset?"+q.Encode(), nil, &rs)
	if err == nil && rs.Service != service {
		err = fmt.Errorf("replica set of %q answered for %q", service, rs.Service)
	}
	return rs, err
}

// ReportLoad sends an attached proxy's load report.
func ReportLoad(ctx context.Context, c *api.Client, service string, r LoadReport) error {
	return c.Do(ctx, http.MethodPost, "/v1/services/"+url.PathEscape(service)+"/proxyload", r, nil)
}

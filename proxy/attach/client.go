package attach

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/ferryserve/ferry/internal/rpc"
)

// PollReplicaSet long-polls a service's replica set: it returns at once when the controller's
// Seq differs from after (pass 0 for the current set), else when the set changes or after wait
// (at most MaxPollWait; 0 answers at once with the current set). Cancel ctx to give up.
func PollReplicaSet(ctx context.Context, c *rpc.Client, service string, after uint64, wait time.Duration) (ReplicaSet, error) {
	q := url.Values{}
	q.Set("after", strconv.FormatUint(after, 10))
	q.Set("wait", strconv.FormatFloat(max(wait, 0).Seconds(), 'f', -1, 64))
	var rs ReplicaSet
	leader := &leaderCapture{}
	err := withCapture(c, leader).Do(ctx, http.MethodGet, "/v1/services/"+url.PathEscape(service)+"/replicaset?"+q.Encode(), nil, &rs)
	if err != nil && leader.url != "" {
		return rs, &NotLeaderError{Leader: leader.url, Err: err}
	}
	if err == nil && rs.Service != service {
		err = fmt.Errorf("replica set of %q answered for %q", service, rs.Service)
	}
	return rs, err
}

// HeaderLeader is the header in which a follower controller names the leader's API URL, with
// 503 (internal/controller's HeaderLeader; the attach package does not import the controller).
const HeaderLeader = "X-Ferry-Leader"

// NotLeaderError is a follower controller's answer: Leader is the URL it named.
type NotLeaderError struct {
	Leader string
	Err    error
}

func (e *NotLeaderError) Error() string { return e.Err.Error() + " (leader: " + e.Leader + ")" }
func (e *NotLeaderError) Unwrap() error { return e.Err }

// leaderCapture is a RoundTripper that notes the leader a 503 names.
type leaderCapture struct {
	next http.RoundTripper
	url  string
}

func (l *leaderCapture) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		l.url = resp.Header.Get(HeaderLeader)
	}
	return resp, err
}

// withCapture is c with its transport wrapped by capture, for one call.
func withCapture(c *rpc.Client, capture *leaderCapture) *rpc.Client {
	hc := http.Client{}
	if c.HTTP != nil {
		hc = *c.HTTP
	}
	capture.next = hc.Transport
	if capture.next == nil {
		capture.next = http.DefaultTransport
	}
	hc.Transport = capture
	cc := *c
	cc.HTTP = &hc
	return &cc
}

// ReportLoad sends an attached proxy's load report.
func ReportLoad(ctx context.Context, c *rpc.Client, service string, r LoadReport) error {
	return c.Do(ctx, http.MethodPost, "/v1/services/"+url.PathEscape(service)+"/proxyload", r, nil)
}

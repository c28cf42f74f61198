package attach

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/rpc"
)

// An attached gateway (`ferry proxy --attach-all`, GatewayFollower) fronts every service of the
// controller: it long-polls the list of their names, as a Follower long-polls one service's
// replica set, and follows each listed service as a Follower does, in one gateway that routes
// by the request's "model".
//
//	GET  /v1/attach/services?after=SEQ&wait=SECONDS  long poll for the names of the services
//
// The list carries names only: each service's proxy configuration comes with its replica set,
// and nothing of its task (YAML, envs, secrets) is on this route.

// ServiceList is what an attached gateway fronts: the names of the controller's services,
// sorted, those being taken down left out. Seq identifies it as a ReplicaSet's does; Seq 0
// means the controller has not published a list yet (it is still restoring its services),
// and a gateway keeps what it fronts until a list with a non-zero Seq arrives.
type ServiceList struct {
	Seq      uint64   `json:"seq"`
	Services []string `json:"services"`
}

// ServiceFeed holds the list of services for long polls: Publish moves Seq when the names
// change and wakes every Wait. The zero value is ready to use, with Seq 0.
type ServiceFeed struct {
	board board[[]string]
}

// Publish sets the names (in any order); Seq moves only when they differ from the last ones,
// or at the first Publish, which may be of no service at all.
func (f *ServiceFeed) Publish(names []string) {
	sorted := slices.Clone(names)
	if sorted == nil {
		sorted = []string{}
	}
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	f.board.update(func(cur *[]string) bool {
		if *cur != nil && slices.Equal(*cur, sorted) {
			return false
		}
		*cur = sorted
		return true
	})
}

// Seq returns the current Seq; 0 before the first Publish.
func (f *ServiceFeed) Seq() uint64 { return f.board.current() }

// Wait returns the current list as soon as it is not the one a gateway at Seq after has (see
// Feed.Wait).
func (f *ServiceFeed) Wait(ctx context.Context, after uint64, wait time.Duration) ServiceList {
	seq, names := f.board.wait(ctx, after, wait, func(names []string) []string {
		if names == nil {
			return []string{}
		}
		return slices.Clone(names)
	})
	return ServiceList{Seq: seq, Services: names}
}

// ServiceLister is the controller's side of the list route: in the controller, its
// ServiceFeed, answering at once once the controller stops.
type ServiceLister interface {
	// ListServices is a long poll for the list of services, as ServiceFeed.Wait.
	ListServices(ctx context.Context, after uint64, wait time.Duration) ServiceList
}

// ServiceListPath is the list route's path; a follower controller answers it 503 naming the
// leader, as it does the replica set's, rather than forward a long poll.
const ServiceListPath = "/v1/attach/services"

// ServiceListRoutes is the list route, for rpc.NewHandler, behind the attach token like the
// others.
func ServiceListRoutes(l ServiceLister, log *zap.Logger) []rpc.Route {
	return []rpc.Route{{Method: http.MethodGet, Pattern: ServiceListPath, Scope: rpc.ScopeAttach,
		Handler: func(w http.ResponseWriter, r *http.Request) {
			after, wait, err := pollQuery(r)
			if err != nil {
				rpc.WriteError(w, log, err)
				return
			}
			rpc.WriteJSON(w, http.StatusOK, l.ListServices(r.Context(), after, wait))
		}}}
}

// PollServices long-polls the list of services, as PollReplicaSet does a replica set.
func PollServices(ctx context.Context, c *rpc.Client, after uint64, wait time.Duration) (ServiceList, error) {
	q := url.Values{}
	q.Set("after", strconv.FormatUint(after, 10))
	q.Set("wait", strconv.FormatFloat(max(wait, 0).Seconds(), 'f', -1, 64))
	var list ServiceList
	leader := &leaderCapture{}
	err := withCapture(c, leader).Do(ctx, http.MethodGet, ServiceListPath+"?"+q.Encode(), nil, &list)
	if err != nil && leader.url != "" {
		return list, &NotLeaderError{Leader: leader.url, Err: err}
	}
	return list, err
}

package attach

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/rpc"
)

// Service is one service as the attach routes serve it: in the controller its *Hub.
type Service interface {
	// Poll is a long poll for the service's replica set, as Feed.Wait, with its proxy
	// configuration; it returns the current set when ctx ends.
	Poll(ctx context.Context, after uint64, wait time.Duration) ReplicaSet
	// Report records a proxy's load report.
	Report(r LoadReport) error
}

// Routes are the two attach routes, for rpc.NewHandler, which puts them behind the
// controller's token or the attach token (rpc.ScopeAttach), the one attached proxies hold. find returns the named service, or an error that wraps rpc.ErrNotFound;
// log gets the failures that are the controller's own.
func Routes(find func(name string) (Service, error), log *zap.Logger) []rpc.Route {
	h := handlers{find: find, log: log}
	return []rpc.Route{
		{Method: http.MethodGet, Pattern: "/v1/services/{name}/replicaset", Handler: h.replicaSet, Scope: rpc.ScopeAttach},
		{Method: http.MethodPost, Pattern: "/v1/services/{name}/proxyload", Handler: h.proxyLoad, Scope: rpc.ScopeAttach},
	}
}

type handlers struct {
	find func(name string) (Service, error)
	log  *zap.Logger
}

// invalid is a bad request answered with msg, worded as the API's own routes word theirs.
func invalid(msg string) error { return &rpc.Error{Kind: rpc.ErrInvalid, Msg: msg} }

// replicaSet serves GET .../replicaset?after=SEQ&wait=SECONDS.
func (h handlers) replicaSet(w http.ResponseWriter, r *http.Request) {
	after, wait, err := pollQuery(r)
	if err != nil {
		rpc.WriteError(w, h.log, err)
		return
	}
	name := r.PathValue("name")
	svc, err := h.find(name)
	if err != nil {
		rpc.WriteError(w, h.log, err)
		return
	}
	rs := svc.Poll(r.Context(), after, wait)
	rs.Service = name
	rpc.WriteJSON(w, http.StatusOK, rs)
}

// pollQuery reads a long poll's ?after=SEQ&wait=SECONDS: after defaults to 0, wait to
// DefaultPollWait, capped at MaxPollWait.
func pollQuery(r *http.Request) (after uint64, wait time.Duration, err error) {
	q := r.URL.Query()
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, invalid("after must be a non-negative integer")
		}
		after = n
	}
	wait = DefaultPollWait
	if v := q.Get("wait"); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs < 0 || math.IsNaN(secs) || math.IsInf(secs, 0) {
			return 0, 0, invalid("wait must be a non-negative number of seconds")
		}
		wait = min(time.Duration(secs*float64(time.Second)), MaxPollWait)
	}
	return after, wait, nil
}

// proxyLoad serves POST .../proxyload.
func (h handlers) proxyLoad(w http.ResponseWriter, r *http.Request) {
	var rep LoadReport
	if err := rpc.DecodeBody(w, r, 1<<20, &rep); err != nil {
		rpc.WriteError(w, h.log, invalid("decode report: "+err.Error()))
		return
	}
	if rep.ProxyID == "" {
		rpc.WriteError(w, h.log, invalid("proxy_id must not be empty"))
		return
	}
	svc, err := h.find(r.PathValue("name"))
	if err == nil {
		err = svc.Report(rep)
	}
	if err != nil {
		rpc.WriteError(w, h.log, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

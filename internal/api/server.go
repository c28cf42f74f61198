package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/ferryserve/ferry/internal/rpc"
	"go.uber.org/zap"
)

// Backend is what the server needs from the controller.
type Backend interface {
	CreateService(ctx context.Context, req CreateServiceRequest) (ServiceStatus, error)
	// Services returns the named services, or all when names is empty; unknown names are
	// ErrNotFound.
	Services(names []string) ([]ServiceStatus, error)
	// DeleteService tears the service down: what it could not stop (an infra that did not
	// answer) is in LeftBehind, not an error.
	DeleteService(ctx context.Context, name string) (DeleteServiceResult, error)
	// UpdateService starts a rollout of the service to req.Task and returns at once.
	UpdateService(ctx context.Context, name string, req UpdateServiceRequest) (ServiceStatus, error)
	// ReplicaLogPath returns a local file with a replica's output.
	ReplicaLogPath(service string, replicaID int) (string, error)
	// ControllerLogPath returns the controller's own log file ("" when it logs to a terminal).
	ControllerLogPath() string
	Status() ControllerStatus
	// Infras is the controller's view of its infras, from memory: it answers at once,
	// whatever an infra does.
	Infras() InfraHealth
	// Stop asks the controller to exit; it returns at once.
	Stop()
}

// NewHandler returns the API's HTTP handler: Backend's routes and the extra ones, which a
// package that owns a protocol of its own adds (proxy/attach's), every one behind the token
// (rpc.NewHandler).
func NewHandler(b Backend, tokens Tokens, log *zap.Logger, extra ...Route) http.Handler {
	s := &server{b: b, log: log}
	return rpc.NewHandler(tokens, s.routes(extra))
}

// routes lists every endpoint, Backend's and then extra; NewHandler puts each behind the token.
func (s *server) routes(extra []Route) []Route {
	return append([]Route{
		{Method: http.MethodGet, Pattern: "/v1/controller", Handler: s.controllerStatus, Scope: ScopeFull},
		{Method: http.MethodPost, Pattern: "/v1/controller/stop", Handler: s.controllerStop, Scope: ScopeFull},
		{Method: http.MethodGet, Pattern: "/v1/controller/logs", Handler: s.controllerLogs, Scope: ScopeFull},
		{Method: http.MethodPost, Pattern: "/v1/services", Handler: s.createService, Scope: ScopeFull},
		{Method: http.MethodGet, Pattern: "/v1/services", Handler: s.listServices, Scope: ScopeFull},
		{Method: http.MethodDelete, Pattern: "/v1/services/{name}", Handler: s.deleteService, Scope: ScopeFull},
		{Method: http.MethodPost, Pattern: "/v1/services/{name}/update", Handler: s.updateService, Scope: ScopeFull},
		{Method: http.MethodGet, Pattern: "/v1/services/{name}/replicas/{id}/logs", Handler: s.replicaLogs, Scope: ScopeFull},
		{Method: http.MethodGet, Pattern: "/v1/infras", Handler: s.infras, Scope: ScopeFull},
	}, extra...)
}

type server struct {
	b   Backend
	log *zap.Logger
}

func (s *server) controllerStatus(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusOK, s.b.Status())
}

func (s *server) controllerStop(w http.ResponseWriter, _ *http.Request) {
	WriteJSON(w, http.StatusAccepted, map[string]string{"status": "stopping"})
	s.b.Stop()
}

func (s *server) createService(w http.ResponseWriter, r *http.Request) {
	var req CreateServiceRequest
	if err := DecodeBody(w, r, maxTaskBytes, &req); err != nil {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "decode request: "+err.Error())
		return
	}
	st, err := s.b.CreateService(r.Context(), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	WriteJSON(w, http.StatusCreated, st)
}

func (s *server) updateService(w http.ResponseWriter, r *http.Request) {
	var req UpdateServiceRequest
	if err := DecodeBody(w, r, maxTaskBytes, &req); err != nil {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "decode request: "+err.Error())
		return
	}
	st, err := s.b.UpdateService(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.fail(w, err)
		return
	}
	WriteJSON(w, http.StatusAccepted, st)
}

// maxTaskBytes bounds a create or update request: a task is a few KB.
const maxTaskBytes = 8 << 20

func (s *server) listServices(w http.ResponseWriter, r *http.Request) {
	var names []string
	for _, n := range strings.Split(r.URL.Query().Get("names"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	list, err := s.b.Services(names)
	if err != nil {
		s.fail(w, err)
		return
	}
	if list == nil {
		list = []ServiceStatus{}
	}
	WriteJSON(w, http.StatusOK, list)
}

func (s *server) fail(w http.ResponseWriter, err error) { WriteError(w, s.log, err) }

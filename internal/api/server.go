package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

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

// Tokens are the credentials the API accepts. Full may call every route; Attach only the
// routes of ScopeAttach, what an attached proxy calls. An empty token matches nothing.
type Tokens struct {
	Full   string
	Attach string
}

// Scope is what a route requires of the token.
type Scope int

const (
	// ScopeFull routes take the controller token alone; a Route's zero Scope is this one.
	ScopeFull Scope = iota
	// ScopeAttach routes take the attach token or the controller token: they read a
	// service's replica set and take load reports, and launch nothing.
	ScopeAttach
)

// NewHandler returns the API's HTTP handler: Backend's routes and the extra ones, which a
// package that owns a protocol of its own adds (proxy/attach's). Every request, whatever its
// path and whether or not a route matches it, must carry "Authorization: Bearer TOKEN", also on
// the socket and loopback: the API launches programs and reads their logs, so any process that
// could call it without a token would own the machine's services. A token of too narrow a
// scope for its route gets 403.
func NewHandler(b Backend, tokens Tokens, log *zap.Logger, extra ...Route) http.Handler {
	s := &server{b: b, log: log}
	mux := http.NewServeMux()
	for _, r := range s.routes(extra) {
		mux.HandleFunc(r.Method+" "+r.Pattern, requireScope(r.Scope, r.Handler))
	}
	return requireToken(tokens, mux)
}

// Route is one endpoint of the API. Pattern is an http.ServeMux path pattern ("{name}"
// wildcards are read with PathValue).
type Route struct {
	Method  string
	Pattern string
	Handler http.HandlerFunc
	// Scope is the token the route requires: ScopeFull unless set.
	Scope Scope
}

// routes lists every endpoint, Backend's and then extra; NewHandler puts each behind the token.
func (s *server) routes(extra []Route) []Route {
	return append([]Route{
		{http.MethodGet, "/v1/controller", s.controllerStatus, ScopeFull},
		{http.MethodPost, "/v1/controller/stop", s.controllerStop, ScopeFull},
		{http.MethodGet, "/v1/controller/logs", s.controllerLogs, ScopeFull},
		{http.MethodPost, "/v1/services", s.createService, ScopeFull},
		{http.MethodGet, "/v1/services", s.listServices, ScopeFull},
		{http.MethodDelete, "/v1/services/{name}", s.deleteService, ScopeFull},
		{http.MethodPost, "/v1/services/{name}/update", s.updateService, ScopeFull},
		{http.MethodGet, "/v1/services/{name}/replicas/{id}/logs", s.replicaLogs, ScopeFull},
		{http.MethodGet, "/v1/infras", s.infras, ScopeFull},
	}, extra...)
}

// scopeKey is the request context key of the Scope the request's token grants.
type scopeKey struct{}

// requireToken lets through only requests that carry one of the tokens, noting the scope it
// grants for requireScope. SHA-256 sums are compared in constant time, against both tokens
// every time, so the time taken says neither how long a token is, nor how much of it a guess
// got right, nor which token a guess came close to. A refused request's connection is
// closed, a let-through one's trusted (see Server).
func requireToken(tokens Tokens, next http.Handler) http.Handler {
	full := sha256.Sum256([]byte("Bearer " + tokens.Full))
	attach := sha256.Sum256([]byte("Bearer " + tokens.Attach))
	hasFull, hasAttach := tokens.Full != "", tokens.Attach != ""
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get("Authorization")))
		isFull := subtle.ConstantTimeCompare(got[:], full[:]) == 1 && hasFull
		isAttach := subtle.ConstantTimeCompare(got[:], attach[:]) == 1 && hasAttach
		if !isFull && !isAttach {
			refuseConnection(w)
			writeError(w, http.StatusUnauthorized, "unauthorized", "missing or wrong controller token")
			return
		}
		trustConnection(r)
		scope := ScopeAttach
		if isFull {
			scope = ScopeFull
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, scope)))
	})
}

// requireScope runs h only for a token that may call a route of scope need.
func requireScope(need Scope, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		granted, ok := r.Context().Value(scopeKey{}).(Scope)
		if !ok || (granted != ScopeFull && granted != need) {
			writeError(w, http.StatusForbidden, "forbidden", "this token may only follow services and report load (an attached proxy's); this call needs the controller token")
			return
		}
		h(w, r)
	}
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
		writeError(w, http.StatusBadRequest, "invalid_request", "decode request: "+err.Error())
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
		writeError(w, http.StatusBadRequest, "invalid_request", "decode request: "+err.Error())
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

// bodyTimeout bounds reading a request's JSON body. It applies to the body alone: the answer
// may take as long as it needs (a long poll, serve down's drain). A variable for tests.
var bodyTimeout = 30 * time.Second

// DecodeBody decodes r's JSON body, of at most limit bytes, into v, read within 30 s. After a
// failure the connection closes once answered: the rest of a body that stalled is not waited
// for.
func DecodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(bodyTimeout)) // not supported by test recorders
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit)).Decode(v); err != nil {
		w.Header().Set("Connection", "close")
		return err
	}
	_ = rc.SetReadDeadline(time.Time{})
	return nil
}

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

// WriteError answers err in the API's error shape (ErrorBody), with the status its kind maps
// to, which the Client maps back: ErrNotFound 404, ErrConflict 409, ErrInvalid 400,
// ErrForbidden 403. Any other
// error is the controller's own failure: 500, and logged to log unless log is nil. An *Error
// answers its Msg alone, so a handler can word a bad request exactly.
func WriteError(w http.ResponseWriter, log *zap.Logger, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, ErrConflict):
		writeError(w, http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, ErrInvalid):
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
	case errors.Is(err, ErrForbidden):
		writeError(w, http.StatusForbidden, "forbidden", err.Error())
	default:
		if log != nil {
			log.Error("api request failed", zap.Error(err))
		}
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

// WriteJSON answers v as JSON with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, kind, msg string) {
	var body ErrorBody
	body.Error.Message = msg
	body.Error.Code = kind
	WriteJSON(w, code, body)
}

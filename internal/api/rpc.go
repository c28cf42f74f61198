package api

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/rpc"
)

// The generic half of the API (tokens, routes, errors, dialing, the guarded listener) is
// internal/rpc, which the standalone proxy uses without the domain. These names let the
// domain's callers (the controller, the CLI) keep one import.
type (
	Tokens    = rpc.Tokens
	Scope     = rpc.Scope
	Route     = rpc.Route
	Error     = rpc.Error
	ErrorBody = rpc.ErrorBody
	Server    = rpc.Server
)

// Scopes: see rpc.
const (
	ScopeFull   = rpc.ScopeFull
	ScopeAttach = rpc.ScopeAttach
)

// Error kinds: see rpc.
var (
	ErrNotFound     = rpc.ErrNotFound
	ErrConflict     = rpc.ErrConflict
	ErrInvalid      = rpc.ErrInvalid
	ErrUnauthorized = rpc.ErrUnauthorized
	ErrForbidden    = rpc.ErrForbidden
	ErrUnreachable  = rpc.ErrUnreachable
)

// WriteError is rpc.WriteError.
func WriteError(w http.ResponseWriter, log *zap.Logger, err error) { rpc.WriteError(w, log, err) }

// WriteJSON is rpc.WriteJSON.
func WriteJSON(w http.ResponseWriter, code int, v any) { rpc.WriteJSON(w, code, v) }

// DecodeBody is rpc.DecodeBody.
func DecodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	return rpc.DecodeBody(w, r, limit, v)
}

// NewServer is rpc.NewServer.
func NewServer(handler http.Handler, maxConns int, log *zap.Logger) *Server {
	return rpc.NewServer(handler, maxConns, log)
}

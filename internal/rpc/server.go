package rpc

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"
)

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

// Route is one endpoint of the API. Pattern is an http.ServeMux path pattern ("{name}"
// wildcards are read with PathValue).
type Route struct {
	Method  string
	Pattern string
	Handler http.HandlerFunc
	// Scope is the token the route requires: ScopeFull unless set.
	Scope Scope
}

// NewHandler serves routes. Every request, whatever its path and whether or not a route
// matches it, must carry "Authorization: Bearer TOKEN", also on the socket and loopback: the
// controller's API launches programs and reads their logs, so any process that could call it
// without a token would own the machine's services. A token of too narrow a scope for its
// route gets 403.
func NewHandler(tokens Tokens, routes []Route) http.Handler {
	mux := http.NewServeMux()
	for _, r := range routes {
		mux.HandleFunc(r.Method+" "+r.Pattern, requireScope(r.Scope, r.Handler))
	}
	return requireToken(tokens, mux)
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
			WriteErrorCode(w, http.StatusUnauthorized, "unauthorized", "missing or wrong controller token")
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
			WriteErrorCode(w, http.StatusForbidden, "forbidden", "this token may only follow services and report load (an attached proxy's); this call needs the controller token")
			return
		}
		h(w, r)
	}
}

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

// WriteError answers err in the API's error shape (ErrorBody), with the status its kind maps
// to, which the Client maps back: ErrNotFound 404, ErrConflict 409, ErrInvalid 400,
// ErrForbidden 403. Any other error is the controller's own failure: 500, and logged to log
// unless log is nil. An *Error answers its Msg alone, so a handler can word a bad request
// exactly.
func WriteError(w http.ResponseWriter, log *zap.Logger, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		WriteErrorCode(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, ErrConflict):
		WriteErrorCode(w, http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, ErrInvalid):
		WriteErrorCode(w, http.StatusBadRequest, "invalid_request", err.Error())
	case errors.Is(err, ErrForbidden):
		WriteErrorCode(w, http.StatusForbidden, "forbidden", err.Error())
	default:
		if log != nil {
			log.Error("api request failed", zap.Error(err))
		}
		WriteErrorCode(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

// WriteJSON answers v as JSON with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// WriteErrorCode answers an error of the given status and code in the API's error shape.
func WriteErrorCode(w http.ResponseWriter, code int, kind, msg string) {
	var body ErrorBody
	body.Error.Message = msg
	body.Error.Code = kind
	WriteJSON(w, code, body)
}

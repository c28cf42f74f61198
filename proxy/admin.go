package proxy

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// MinAdminTokenLength rejects admin tokens short enough to guess: the admin listener answers
// as fast as it can, so a token must not be brute-forced online.
const MinAdminTokenLength = 16

// requireBearer protects h with a bearer token, the way Prometheus sends one from a scrape
// config's `authorization: {credentials_file: ...}` (or `bearer_token_file`). An empty token
// protects nothing. The check compares SHA-256 sums in constant time, so neither the token's
// length nor how much of it a guess got right shows in the time taken.
//
// Only /metrics goes behind it. /healthz stays open: what probes it (a kubelet's liveness
// probe, a load balancer's health check) rarely can send a credential, and it tells nothing
// beyond "this process serves HTTP".
func requireBearer(token string, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		presented, ok := bearerToken(r.Header.Get("Authorization"))
		got := sha256.Sum256([]byte(presented))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 || !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="ferry-metrics"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// bearerToken takes the credentials out of an "Authorization: Bearer TOKEN" value; the scheme is
// case-insensitive (RFC 9110 §11.1).
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

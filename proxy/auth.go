package proxy

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"

	"github.com/valyala/fasthttp"
)

var (
	headerAuthorization   = []byte("Authorization")
	headerAPIKey          = []byte("Api-Key")
	headerWWWAuthenticate = []byte("WWW-Authenticate")
	bearerPrefix          = []byte("bearer ")
	bearerChallenge       = []byte(`Bearer realm="ferry"`)
)

// apiKeys checks a request's API key against a service's key hashes (configs.HashAPIKey: the hex
// SHA-256 of the key). The proxy holds hashes only, so no key can leak from its memory, logs or
// status, and the comparison is constant-time over every hash: how long a check takes says
// nothing about which key, or how much of one, matched.
type apiKeys struct {
	hashes [][sha256.Size]byte
	// managed are the process's managed keys, which the service accepts too (tenancy.go).
	managed *Tenancy
}

// newAPIKeys decodes hex hashes. nil hashes mean no auth (nil *apiKeys); an empty non-nil slice
// is a service that requires keys but has none, which rejects everything.
func newAPIKeys(hexHashes []string) (*apiKeys, error) {
	if hexHashes == nil {
		return nil, nil
	}
	k := &apiKeys{hashes: make([][sha256.Size]byte, 0, len(hexHashes))}
	for i, h := range hexHashes {
		var sum [sha256.Size]byte
		if n, err := hex.Decode(sum[:], []byte(h)); err != nil || n != sha256.Size || len(h) != 2*sha256.Size {
			return nil, fmt.Errorf("api key hash %d: want %d hex digits (a SHA-256)", i, 2*sha256.Size)
		}
		k.hashes = append(k.hashes, sum)
	}
	return k, nil
}

// credential is the API key a request presents, as "Authorization: Bearer KEY" (OpenAI's SDKs)
// or "api-key: KEY" (Azure OpenAI's), hashed at most once however many sets of keys it is
// checked against: a service's own, the managed keys, every service's at a gateway.
type credential struct {
	key    []byte
	sum    [sha256.Size]byte
	hashed bool
}

// presented reads the request's credential; its key is empty when it presents none.
func presented(h *fasthttp.RequestHeader) credential { return credential{key: presentedKey(h)} }

// digest is the key's SHA-256, computed on first use.
func (c *credential) digest() *[sha256.Size]byte {
	if !c.hashed {
		c.sum, c.hashed = sha256.Sum256(c.key), true
	}
	return &c.sum
}

// allows reports whether the credential is one of the keys, or a managed key the service
// accepts.
func (k *apiKeys) allows(c *credential) bool {
	_, ok := k.match(c)
	return ok || k.managed.allows(c)
}

// match is allows that also says which key matched (its index in hashes), for limits kept per
// key. Every hash is compared, and the index is selected without a branch, so the time taken
// does not depend on which key matched or how much of one.
func (k *apiKeys) match(c *credential) (index int, ok bool) {
	if len(c.key) == 0 || len(k.hashes) == 0 { // none: a service of managed keys only hashes once, there
		return -1, false
	}
	sum := c.digest()
	match := 0
	for i := range k.hashes {
		eq := subtle.ConstantTimeCompare(sum[:], k.hashes[i][:])
		index = subtle.ConstantTimeSelect(eq, i, index)
		match |= eq
	}
	if match != 1 {
		return -1, false
	}
	return index, true
}

func presentedKey(h *fasthttp.RequestHeader) []byte {
	if v := h.PeekBytes(headerAuthorization); len(v) > len(bearerPrefix) {
		if bytes.EqualFold(v[:len(bearerPrefix)], bearerPrefix) {
			return bytes.TrimSpace(v[len(bearerPrefix):])
		}
		return nil
	}
	return bytes.TrimSpace(h.PeekBytes(headerAPIKey))
}

// Failed API key attempts allowed per client address (an IPv6 client by its /64): a burst of
// authFailureBurst, refilled at authFailuresPerSecond. Keys are too long to guess, but each
// attempt costs a hash, an answer and a log line.
const (
	authFailuresPerSecond = 5
	authFailureBurst      = 20
)

// newAuthFailureLimiter counts failed key attempts per client address.
func newAuthFailureLimiter() *rateLimiter {
	return newRateLimiter(RateLimit{RequestsPerSecond: authFailuresPerSecond, Burst: authFailureBurst}, 0)
}

// refuseKey answers a request without a valid API key: 401 with a Bearer challenge, or, once
// its address has failed more than the limiter allows, 429 with Retry-After and the connection
// closed, so that each further guess costs a new connection. It reports whether it answered 401.
func refuseKey(ctx *fasthttp.RequestCtx, failures *rateLimiter, errs *errorBodies) bool {
	if _, wait, ok := failures.admitAddr(ctx.RemoteIP(), failures.now()); !ok {
		writeError(ctx, fasthttp.StatusTooManyRequests, errs.authFailures)
		setRetryAfter(ctx, wait)
		ctx.SetConnectionClose()
		return false
	}
	writeError(ctx, fasthttp.StatusUnauthorized, errs.unauthorized)
	ctx.Response.Header.SetBytesKV(headerWWWAuthenticate, bearerChallenge)
	return true
}

// unauthorized refuses a request to the service without a valid API key (refuseKey), and logs
// it apart from the requests served (accesslog.go).
func (s *Service) unauthorized(ctx *fasthttp.RequestCtx) {
	refuseKey(ctx, s.authFailures, &s.errs)
	s.recordSelfAnswer(ctx, nil, ctx.Time(), true)
}

// stripCredentials removes the client's key from the upstream request: it is the gateway's
// credential, and a replica (or its logs) has no business seeing it.
func stripCredentials(h *fasthttp.RequestHeader) {
	h.DelBytes(headerAuthorization)
	h.DelBytes(headerAPIKey)
}

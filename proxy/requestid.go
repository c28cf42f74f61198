package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"sync/atomic"
)

// Request ids are a random per-process prefix and a counter: unique across proxy processes and
// restarts with overwhelming probability, sortable within one process, and generated without
// crypto or allocation per request.
var (
	requestIDPrefix  = newRequestIDPrefix()
	requestIDCounter atomic.Uint64
)

func newRequestIDPrefix() []byte {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	out := make([]byte, 0, 2*len(b)+1)
	out = hex.AppendEncode(out, b[:])
	return append(out, '-')
}

// appendRequestID appends a new request id, like "9f86d081884c7d65-1a2b", to dst.
func appendRequestID(dst []byte) []byte {
	dst = append(dst, requestIDPrefix...)
	return strconv.AppendUint(dst, requestIDCounter.Add(1), 16)
}

// maxClientRequestID is the longest X-Request-Id a client may choose: a UUID is 36 characters,
// and a trace id with a prefix rarely twice that.
const maxClientRequestID = 128

// saneRequestID reports whether a client's X-Request-Id is kept: 1 to maxClientRequestID visible
// ASCII characters. Any other (8 KiB of it, spaces, control or non-ASCII bytes) would be
// forwarded to every replica tried and written into every log line, so a generated id replaces
// it.
func saneRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > maxClientRequestID {
		return false
	}
	for _, c := range id {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

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

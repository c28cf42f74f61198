package rpc

import (
	"testing"

	"github.com/ferryserve/ferry/internal/sourcecheck"
)

// TestTokenCompareIsConstantTime guards the token check's shape, which no timing test can pin
// down reliably: it compares with crypto/subtle, never with == or bytes.Equal.
func TestTokenCompareIsConstantTime(t *testing.T) {
	sourcecheck.ConstantTimeCompare(t, "server.go", "requireToken")
}

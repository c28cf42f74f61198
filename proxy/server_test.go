package proxy

import (
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestMalformedRequestsLogNoHeaderValues: at debug level the proxy logs why fasthttp could not
// read a request, but never the header values fasthttp quotes in its errors, which may be API
// keys. It used to log them.
func TestMalformedRequestsLogNoHeaderValues(t *testing.T) {
	const secret = "sk-ferry-SECRET-0123456789"
	core, logs := observer.New(zapcore.DebugLevel)
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{Logger: zap.New(core)}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")
	requests := map[string]string{
		"control byte in a value": "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\x01\r\nContent-Length: 2\r\n\r\n{}",
		"space before the colon":  "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Key" + secret + " : v\r\nContent-Length: 2\r\n\r\n{}",
		"bad first line":          "POST /v1/" + secret + " HTTP/1.1 junk\r\nHost: x\r\n\r\n",
		"bad chunk":               "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + secret + "\r\n",
	}
	for name, raw := range requests {
		t.Run(name, func(t *testing.T) {
			before := logs.Len()
			conn, br := headersOnly(t, addr, raw)
			resp := answerWithin(t, conn, br, waitTimeout)
			if resp.StatusCode < 400 {
				t.Fatalf("a malformed request got %d", resp.StatusCode)
			}
			_ = conn.Close()
			waitFor(t, "fasthttp's debug line", func() bool { return logs.Len() > before })
			said := false
			for _, e := range logs.All()[before:] {
				line := fmt.Sprint(e.Message, e.ContextMap())
				if strings.Contains(line, "SECRET") {
					t.Errorf("logged: %s", line)
				}
				said = said || strings.Contains(line, "malformed request")
			}
			if !said {
				t.Errorf("no debug line says the request was malformed: %v", logs.All()[before:])
			}
		})
	}
}

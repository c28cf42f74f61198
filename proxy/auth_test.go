package proxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func hashKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

func TestAPIKeys(t *testing.T) {
	const good, other = "sk-ferry-0123456789abcdef", "sk-ferry-fedcba9876543210"
	var seenAuth atomic.Value
	seenAuth.Store("")
	u := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		seenAuth.Store(r.Header.Get("Authorization") + r.Header.Get("Api-Key"))
		okHandler(w, r)
	})
	_, base := startProxy(t, ServiceConfig{APIKeyHashes: []string{hashKey(good), hashKey(other)}}, backendsOf(u)...)
	c := newClient(t)
	tests := map[string]struct {
		headers    []string
		wantStatus int
	}{
		"bearer":                {headers: []string{"Authorization", "Bearer " + good}, wantStatus: 200},
		"second key":            {headers: []string{"Authorization", "Bearer " + other}, wantStatus: 200},
		"scheme is case-blind":  {headers: []string{"Authorization", "bearer " + good}, wantStatus: 200},
		"azure api-key header":  {headers: []string{"api-key", good}, wantStatus: 200},
		"no key":                {wantStatus: 401},
		"wrong key":             {headers: []string{"Authorization", "Bearer sk-ferry-0123456789abcdeX"}, wantStatus: 401},
		"key prefix only":       {headers: []string{"Authorization", "Bearer " + good[:10]}, wantStatus: 401},
		"basic scheme":          {headers: []string{"Authorization", "Basic " + good}, wantStatus: 401},
		"empty bearer":          {headers: []string{"Authorization", "Bearer "}, wantStatus: 401},
		"key with extra suffix": {headers: []string{"Authorization", "Bearer " + good + "x"}, wantStatus: 401},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := u.hits.Load()
			res := do(t, c, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(`{}`), tc.headers...)
			if res.status != tc.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", res.status, tc.wantStatus, res.body)
			}
			if tc.wantStatus == 401 {
				if e := decodeError(t, res.body); e.Error.Code != "invalid_api_key" || e.Error.Type != "invalid_request_error" {
					t.Errorf("401 body = %+v", e)
				}
				if strings.Contains(res.body, good) {
					t.Errorf("401 body echoes the key: %s", res.body)
				}
				if got := res.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Errorf("WWW-Authenticate = %q", got)
				}
				if u.hits.Load() != before {
					t.Errorf("an unauthorized request reached the replica")
				}
				return
			}
			if got := seenAuth.Load().(string); got != "" {
				t.Errorf("replica saw the client's credential %q", got)
			}
		})
	}
}

func TestEmptyKeyListRejectsEverything(t *testing.T) {
	u := startUpstream(t, "a", okHandler)
	_, base := startProxy(t, ServiceConfig{APIKeyHashes: []string{}}, backendsOf(u)...)
	res := do(t, newClient(t), http.MethodGet, base+"/v1/models", nil, "Authorization", "Bearer anything-at-all-here")
	if res.status != 401 {
		t.Fatalf("status = %d, want 401", res.status)
	}
}

func TestBadKeyHashIsAConfigError(t *testing.T) {
	_, err := NewService(ServiceConfig{Name: "x", APIKeyHashes: []string{"sk-plaintext-key"}})
	if err == nil || strings.Contains(err.Error(), "sk-plaintext-key") {
		t.Fatalf("NewService error = %v, want an error that does not echo the value", err)
	}
}

func TestConcurrencyLimitIs429(t *testing.T) {
	u, g := startGatedUpstream(t, "a")
	defer g.open() // before the proxy's shutdown, which waits for held requests
	svc, base := startProxy(t, ServiceConfig{MaxConcurrentRequests: 2}, backendsOf(u)...)
	c := newClient(t)
	done := make(chan result, 2)
	for range 2 {
		go func() { done <- do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`)) }()
	}
	waitFor(t, "two requests in flight", func() bool { return g.arrivals.Load() == 2 && svc.InFlight() == 2 })
	res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`))
	if res.status != http.StatusTooManyRequests {
		t.Fatalf("third request: status = %d, want 429", res.status)
	}
	if e := decodeError(t, res.body); e.Error.Code != "rate_limit_exceeded" {
		t.Errorf("429 body = %+v", e)
	}
	if got := res.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After = %q, want 1", got)
	}
	g.open()
	for range 2 {
		if r := <-done; r.status != 200 {
			t.Errorf("admitted request: status %d", r.status)
		}
	}
	if res := do(t, c, http.MethodPost, base+"/v1/completions", strings.NewReader(`{}`)); res.status != 200 {
		t.Errorf("after the burst: status %d, want 200", res.status)
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 with the given common name.
func writeCert(t *testing.T, dir, cn string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestTLSTermination(t *testing.T) {
	var proto atomic.Value
	proto.Store("")
	u := startUpstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		proto.Store(r.Header.Get("X-Forwarded-Proto"))
		okHandler(w, r)
	})
	certFile, keyFile := writeCert(t, t.TempDir(), "ferry-test")
	cfg, err := LoadTLS(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	_, base := startProxy(t, ServiceConfig{TLS: cfg}, backendsOf(u)...)
	addr := strings.TrimPrefix(base, "http://")

	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // the test certificate is self-signed
	defer tr.CloseIdleConnections()
	res := do(t, &http.Client{Transport: tr}, http.MethodPost, "https://"+addr+"/v1/completions", strings.NewReader(`{}`))
	if res.status != 200 || res.body != `{"ok":true}` {
		t.Fatalf("over TLS: %d %s", res.status, res.body)
	}
	if got := proto.Load().(string); got != "https" {
		t.Errorf("X-Forwarded-Proto = %q, want https", got)
	}
	// Plain HTTP to a TLS listener must not reach the replica.
	before := u.hits.Load()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	_ = conn.Close()
	if strings.Contains(string(buf[:n]), "200 OK") || u.hits.Load() != before {
		t.Errorf("plain HTTP on the TLS port was served: %q", buf[:n])
	}
}

func TestLoadTLSErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadTLS(filepath.Join(dir, "none.pem"), filepath.Join(dir, "none.key")); err == nil {
		t.Error("LoadTLS of missing files succeeded")
	}
	certFile, _ := writeCert(t, dir, "x")
	if _, err := LoadTLS(certFile, certFile); err == nil {
		t.Error("LoadTLS with a certificate as the key succeeded")
	}
}

// TestTLSReloadsRenewedCertificate: a certificate renewed on disk is served to new connections
// without a restart; a broken renewal keeps the last good one.
func TestTLSReloadsRenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writeCert(t, dir, "first")
	cfg, reloader, err := loadTLS(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	commonName := func() string {
		cert, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(cert.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Subject.CommonName
	}
	if got := commonName(); got != "first" {
		t.Fatalf("CN = %q, want first", got)
	}
	writeCert(t, dir, "second")
	later := time.Now().Add(time.Minute)
	for _, f := range []string{certFile, keyFile} {
		if err := os.Chtimes(f, later, later); err != nil {
			t.Fatal(err)
		}
	}
	expireCheck(reloader)
	if got := commonName(); got != "second" {
		t.Errorf("after renewal CN = %q, want second", got)
	}
	if err := os.WriteFile(keyFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	evenLater := later.Add(time.Minute)
	_ = os.Chtimes(keyFile, evenLater, evenLater)
	expireCheck(reloader)
	if got := commonName(); got != "second" {
		t.Errorf("after a broken renewal CN = %q, want the last good one", got)
	}
}

// expireCheck makes the reloader look at the files at the next handshake.
func expireCheck(r *certReloader) {
	r.mu.Lock()
	r.checkedAt = time.Time{}
	r.mu.Unlock()
}

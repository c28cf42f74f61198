// Package testhttp holds HTTP helpers that tests in several packages share (the CLI's and
// the end-to-end tests). Only test code imports it.
package testhttp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// GetOK returns the body of GET url, failing the test unless the answer is 200.
func GetOK(t testing.TB, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, raw)
	}
	return string(raw)
}

// WriteSelfSigned writes a throwaway self-signed certificate for 127.0.0.1 and its key to
// dir as cert.pem and key.pem (0600).
func WriteSelfSigned(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	return WriteSelfSignedFor(t, dir)
}

// WriteSelfSignedFor is WriteSelfSigned for 127.0.0.1 and dnsNames, such as the
// <service>.<namespace>.svc an APIService or a webhook is called by; the certificate is its own
// caBundle.
func WriteSelfSignedFor(t testing.TB, dir string, dnsNames ...string) (certFile, keyFile string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "ferry-test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     dnsNames,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

// Completion posts a completion (prompt "hello") for model to base's /v1/completions and
// returns the status and the answer's model, or its OpenAI-style error code.
func Completion(c *http.Client, base, model string, maxTokens int) (int, string, error) {
	body := fmt.Sprintf(`{"model":%q,"prompt":"hello","max_tokens":%d}`, model, maxTokens)
	resp, err := c.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	var answer struct {
		Model string `json:"model"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &answer); err != nil {
		return resp.StatusCode, "", fmt.Errorf("answer %q: %w", b, err)
	}
	return resp.StatusCode, answer.Model + answer.Error.Code, nil
}

// ModelIDs is the ids GET base/v1/models lists, sent with the bearer token when not empty.
func ModelIDs(c *http.Client, base, bearer string) ([]string, error) {
	req, err := http.NewRequest(http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/v1/models: %s", base, resp.Status)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

package testcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	cryptorand "crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// The API aggregation layer, as kubeadm sets it up: the API server proxies the groups of an
// APIService (external.metrics.k8s.io, say) to the server behind it, authenticating itself with
// a client certificate from the front-proxy CA and naming the user in X-Remote-* headers. It
// publishes that CA and the header names in kube-system/extension-apiserver-authentication,
// where an aggregated server reads what to trust. Generating the CA and the client certificate
// costs about a millisecond, so every test cluster has the layer.

// FrontProxyClientName is the common name of the certificate the API server presents to
// aggregated servers, and the one name --requestheader-allowed-names accepts.
const FrontProxyClientName = "front-proxy-client"

// aggregationFlags writes the front-proxy CA and the API server's client certificate under dir
// and returns the kube-apiserver flags that turn the aggregation layer on.
func aggregationFlags(dir string) ([]string, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		return nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ferry-test front-proxy CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(cryptorand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		return nil, err
	}
	clientDER, err := x509.CreateCertificate(cryptorand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: FrontProxyClientName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &clientKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	clientKeyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		return nil, err
	}
	caPath := filepath.Join(dir, "front-proxy-ca.crt")
	certPath := filepath.Join(dir, "front-proxy-client.crt")
	keyPath := filepath.Join(dir, "front-proxy-client.key")
	if err := errors.Join(
		os.WriteFile(caPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600),
		os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clientDER}), 0o600),
		os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: clientKeyDER}), 0o600),
	); err != nil {
		return nil, err
	}
	return []string{
		"--requestheader-client-ca-file=" + caPath,
		"--requestheader-allowed-names=" + FrontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + certPath,
		"--proxy-client-key-file=" + keyPath,
	}, nil
}

// FrontProxyClientCert is the certificate and key the API server presents to aggregated
// servers, for a test that calls one as the aggregation layer would.
func (c *Cluster) FrontProxyClientCert() (certFile, keyFile string) {
	return filepath.Join(c.dir, "front-proxy-client.crt"), filepath.Join(c.dir, "front-proxy-client.key")
}

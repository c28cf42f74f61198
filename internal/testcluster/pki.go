package testcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	cryptorand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// adminUser is the identity the admin token authenticates as; system:masters may do anything.
const adminUser = "ferry-test-admin"

// newToken returns a random bearer token.
func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := cryptorand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// writeTokenFile writes the API server's --token-auth-file: token,user,uid,"groups".
func writeTokenFile(path, token string) error {
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", token, adminUser, adminUser)
	return os.WriteFile(path, []byte(line), 0o600)
}

// writeServiceAccountKey writes a fresh private key that the API server both signs service
// account tokens with and verifies them by; it refuses to start without one.
func writeServiceAccountKey(path string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// writeKubeconfig writes a kubeconfig whose only context, ContextName, is the cluster's admin.
// The API server's serving certificate is self-signed (--cert-dir), so TLS is not verified.
func writeKubeconfig(path, server, token string) error {
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    insecure-skip-tls-verify: true
users:
- name: %[3]s
  user:
    token: %[4]s
contexts:
- name: %[1]s
  context:
    cluster: %[1]s
    user: %[3]s
    namespace: default
current-context: %[1]s
`, ContextName, server, adminUser, token)
	return os.WriteFile(path, []byte(kubeconfig), 0o600)
}

// claimCIDR picks a loopback range for kwok to hand pod IPs out of, inside 127.<100-250>.0.0/16,
// that no other cluster on this machine holds: blocks consecutive /24s (a power of two, 1 to
// 256), aligned, so that they make one CIDR (a /24 for 1, a /22 for 4). It takes an exclusive
// lock on a file named after each /24 and keeps them until release, so a wide range and a /24
// claimed by another test binary never overlap. The kernel drops the locks when the process
// dies, so a crashed test frees its range. Two test packages running clusters at once therefore
// never give two pods the same IP.
func claimCIDR(blocks int) (cidr string, release func(), err error) {
	if blocks < 1 || blocks > 256 || blocks&(blocks-1) != 0 {
		return "", nil, fmt.Errorf("testcluster: %d /24 blocks of pod IPs: want a power of two from 1 to 256", blocks)
	}
	lockDir := filepath.Join(os.TempDir(), "ferry-testcluster-cidrs")
	if err := os.MkdirAll(lockDir, 0o777); err != nil {
		return "", nil, err
	}
	for range 100 {
		second, third := byte(100+rand.IntN(151)), rand.IntN(256/blocks)*blocks
		release, locked, err := lockBlocks(lockDir, second, third, blocks)
		if err != nil {
			return "", nil, err
		}
		if !locked {
			continue
		}
		return (&net.IPNet{IP: net.IPv4(127, second, byte(third), 0), Mask: net.CIDRMask(32-8-bits(blocks), 32)}).String(), release, nil
	}
	return "", nil, fmt.Errorf("testcluster: no free loopback range of %d /24s for pod IPs", blocks)
}

// bits is log2 of a power of two.
func bits(n int) int {
	b := 0
	for n > 1 {
		n >>= 1
		b++
	}
	return b
}

// lockBlocks locks the /24s 127.second.third.0 to 127.second.(third+blocks-1).0, all or none.
func lockBlocks(lockDir string, second byte, third, blocks int) (release func(), locked bool, err error) {
	type held struct {
		path string
		f    *os.File
	}
	var all []held
	release = func() {
		for _, h := range all {
			_ = os.Remove(h.path) // before unlocking: whoever opens the name next gets a new file
			_ = h.f.Close()
		}
	}
	for i := range blocks {
		path := filepath.Join(lockDir, net.IPv4(127, second, byte(third+i), 0).String()+".lock")
		f, ok, err := lockFile(path)
		if err != nil || !ok {
			release()
			return nil, false, err
		}
		_, _ = f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
		all = append(all, held{path, f})
	}
	return release, true, nil
}

// lockFile opens path and takes an exclusive lock on it without waiting. Holders remove the file
// when they release it, so a lock won on a file that is no longer at path (removed, or replaced,
// between our open and our lock) does not count.
func lockFile(path string) (f *os.File, locked bool, err error) {
	f, err = os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	held, errHeld := f.Stat()
	atPath, errAtPath := os.Stat(path)
	if errHeld != nil || errAtPath != nil || !os.SameFile(held, atPath) {
		_ = f.Close()
		return nil, false, nil
	}
	return f, true, nil
}

// freePorts returns n distinct loopback ports that were free a moment ago. Another process can
// take one before the component binds it; Start retries when that happens.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close() // all held until the end, so the n ports differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// selfSignedCert is a fresh serving certificate for 127.0.0.1, signed by its own key: the API
// server does not verify a kubelet's certificate without --kubelet-certificate-authority.
func selfSignedCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := cryptorand.Int(cryptorand.Reader, big.NewInt(1<<62))
	if err != nil {
		return tls.Certificate{}, err
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "kubelet stand-in"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(cryptorand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

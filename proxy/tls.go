package proxy

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// LoadTLS returns a server TLS config for a certificate and key in PEM files. The files are
// checked again at most every certCheckInterval during handshakes and reloaded when either
// changes, so a renewed certificate (certbot, cert-manager) is picked up without a restart; a
// reload that fails keeps serving the last good pair.
func LoadTLS(certFile, keyFile string) (*tls.Config, error) {
	cfg, _, err := loadTLS(certFile, keyFile)
	return cfg, err
}

func loadTLS(certFile, keyFile string) (*tls.Config, *certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile}
	if err := r.load(); err != nil {
		return nil, nil, err
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"http/1.1"},
		GetCertificate: r.get,
	}, r, nil
}

const certCheckInterval = 10 * time.Second

type certReloader struct {
	certFile, keyFile string

	mu        sync.Mutex
	cert      *tls.Certificate
	modTime   time.Time // the newer of the two files' mtimes at the last load
	checkedAt time.Time
}

func (r *certReloader) load() error {
	mod, err := r.filesModTime()
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("load TLS certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert, r.modTime = &cert, mod
	return nil
}

func (r *certReloader) filesModTime() (time.Time, error) {
	var newest time.Time
	for _, f := range []string{r.certFile, r.keyFile} {
		info, err := os.Stat(f)
		if err != nil {
			return time.Time{}, fmt.Errorf("TLS: %w", err)
		}
		if info.ModTime().After(newest) {
			newest = info.ModTime()
		}
	}
	return newest, nil
}

func (r *certReloader) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checkedAt) >= certCheckInterval {
		r.checkedAt = now
		if mod, err := r.filesModTime(); err == nil && !mod.Equal(r.modTime) {
			_ = r.load() // on failure the last good certificate stays
		}
	}
	return r.cert, nil
}

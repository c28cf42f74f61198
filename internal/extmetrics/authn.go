package extmetrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// User is who the aggregator says makes a request.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// Authenticator tells who makes a request, or why it cannot.
type Authenticator interface {
	Authenticate(r *http.Request) (User, error)
}

// The ConfigMap where the API server publishes how to trust its aggregation layer, and its keys.
const (
	AuthConfigMapNamespace = "kube-system"
	AuthConfigMapName      = "extension-apiserver-authentication"
)

// requestHeaderConfig is what the API server published: the CA of its front-proxy client
// certificate, the names that certificate may have, and the headers that carry the user.
type requestHeaderConfig struct {
	roots           *x509.CertPool
	allowedNames    []string
	usernameHeaders []string
	uidHeaders      []string
	groupHeaders    []string
	extraPrefixes   []string
}

// RequestHeader authenticates the aggregation layer as every aggregated API server does (the
// request-header authenticator of k8s.io/apiserver): the TLS client certificate must chain to
// the request-header CA and carry an allowed common name; the user is then the one the headers
// name. It re-reads the ConfigMap every Refresh, so a rotated CA is picked up. A request
// without such a certificate is refused: this server takes no bearer tokens.
type RequestHeader struct {
	client  kubernetes.Interface
	refresh time.Duration
	config  atomic.Pointer[requestHeaderConfig]
	loadErr atomic.Pointer[error]
}

var _ Authenticator = (*RequestHeader)(nil)

// NewRequestHeader reads the request-header configuration through client (which needs get on
// the ConfigMap: the Role extension-apiserver-authentication-reader in kube-system) and keeps it
// fresh while Run runs. refresh <= 0 takes a minute.
func NewRequestHeader(client kubernetes.Interface, refresh time.Duration) *RequestHeader {
	if refresh <= 0 {
		refresh = time.Minute
	}
	return &RequestHeader{client: client, refresh: refresh}
}

// Load reads the ConfigMap once; requests are refused until a Load succeeds.
func (a *RequestHeader) Load(ctx context.Context) error {
	cm, err := a.client.CoreV1().ConfigMaps(AuthConfigMapNamespace).Get(ctx, AuthConfigMapName, metav1.GetOptions{})
	if err == nil {
		var cfg *requestHeaderConfig
		if cfg, err = parseRequestHeader(cm.Data); err == nil {
			a.config.Store(cfg)
			a.loadErr.Store(nil)
			return nil
		}
	}
	err = fmt.Errorf("read %s/%s: %w", AuthConfigMapNamespace, AuthConfigMapName, err)
	a.loadErr.Store(&err)
	return err
}

// Run loads the configuration every refresh until ctx ends (every second until the first
// load succeeds), logging failures through logf.
func (a *RequestHeader) Run(ctx context.Context, logf func(err error)) {
	for {
		wait := a.refresh
		if err := a.Load(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			logf(err)
			if a.config.Load() == nil {
				wait = time.Second
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// parseRequestHeader reads the ConfigMap's requestheader-* keys, the lists JSON arrays as the
// API server writes them.
func parseRequestHeader(data map[string]string) (*requestHeaderConfig, error) {
	caPEM := data["requestheader-client-ca-file"]
	if caPEM == "" {
		return nil, errors.New("no requestheader-client-ca-file: the API server runs without --requestheader-client-ca-file, so it has no aggregation layer")
	}
	cfg := &requestHeaderConfig{roots: x509.NewCertPool()}
	if !cfg.roots.AppendCertsFromPEM([]byte(caPEM)) {
		return nil, errors.New("requestheader-client-ca-file holds no PEM certificate")
	}
	var errs []error
	for key, dst := range map[string]*[]string{
		"requestheader-allowed-names":        &cfg.allowedNames,
		"requestheader-username-headers":     &cfg.usernameHeaders,
		"requestheader-uid-headers":          &cfg.uidHeaders,
		"requestheader-group-headers":        &cfg.groupHeaders,
		"requestheader-extra-headers-prefix": &cfg.extraPrefixes,
	} {
		if v := data[key]; v != "" {
			if err := json.Unmarshal([]byte(v), dst); err != nil {
				errs = append(errs, fmt.Errorf("%s %q: want a JSON array of strings: %w", key, v, err))
			}
		}
	}
	if len(cfg.usernameHeaders) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("no requestheader-username-headers"))
	}
	return cfg, errors.Join(errs...)
}

// Authenticate implements Authenticator.
func (a *RequestHeader) Authenticate(r *http.Request) (User, error) {
	cfg := a.config.Load()
	if cfg == nil {
		if err := a.loadErr.Load(); err != nil {
			return User{}, *err
		}
		return User{}, errors.New("the request-header configuration is not loaded yet")
	}
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return User{}, errors.New("no client certificate: only the API server's aggregation layer may call this server")
	}
	leaf := r.TLS.PeerCertificates[0]
	intermediates := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		intermediates.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: cfg.roots, Intermediates: intermediates,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return User{}, fmt.Errorf("client certificate %q: %w", leaf.Subject.CommonName, err)
	}
	if len(cfg.allowedNames) > 0 && !slices.Contains(cfg.allowedNames, leaf.Subject.CommonName) {
		return User{}, fmt.Errorf("client certificate %q is not among requestheader-allowed-names %v", leaf.Subject.CommonName, cfg.allowedNames)
	}
	u := User{Name: firstHeader(r.Header, cfg.usernameHeaders), UID: firstHeader(r.Header, cfg.uidHeaders)}
	if u.Name == "" {
		return User{}, fmt.Errorf("no user in %v", cfg.usernameHeaders)
	}
	for _, h := range cfg.groupHeaders {
		u.Groups = append(u.Groups, r.Header.Values(h)...)
	}
	u.Extra = extraFromHeaders(r.Header, cfg.extraPrefixes)
	return u, nil
}

func firstHeader(h http.Header, names []string) string {
	for _, name := range names {
		if v := h.Get(name); v != "" {
			return v
		}
	}
	return ""
}

// extraFromHeaders reads PREFIX<key> headers: the key lowercased and percent-unescaped, as
// the aggregator escapes it.
func extraFromHeaders(h http.Header, prefixes []string) map[string][]string {
	var extra map[string][]string
	for name, values := range h {
		for _, prefix := range prefixes {
			if len(name) <= len(prefix) || !strings.EqualFold(name[:len(prefix)], prefix) {
				continue
			}
			key, err := url.PathUnescape(strings.ToLower(name[len(prefix):]))
			if err != nil {
				key = strings.ToLower(name[len(prefix):])
			}
			if extra == nil {
				extra = map[string][]string{}
			}
			extra[key] = append(extra[key], values...)
		}
	}
	return extra
}

// TLSConfig is a serving configuration for cert that asks clients for a certificate without
// verifying it in the handshake: RequestHeader verifies it against the CA of the moment, which
// may rotate while connections are open.
func TLSConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12}
}

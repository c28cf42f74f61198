package controller

import (
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
)

// The API listens on a Unix socket in the home, 0600 in a 0700 directory: only the user who
// owns the home can connect at all, so other local users cannot reach the API, let alone
// exhaust it. A TCP address is opened only when Options.Listen names one (attached proxies on
// other machines need it), and off loopback only with TLS.

// maxSocketPath is the longest socket path every Unix accepts (sun_path is 104 bytes on macOS
// and the BSDs, 108 on Linux, the terminating NUL included).
const maxSocketPath = 103

// socketDirPrefix names the private directory a socket goes to when the home's path is too
// long for one.
const socketDirPrefix = "ferry-api-"

// apiListeners are the listeners the API serves.
type apiListeners struct {
	socket     net.Listener
	socketPath string
	// tcp is nil unless Options.Listen asked for an address; tlsConfig is set when it serves
	// HTTPS.
	tcp       net.Listener
	tlsConfig *tls.Config
	// removeDir removes the private socket directory, if one was made.
	removeDir func()
}

// apiTLS is the certificate and key the TCP API serves HTTPS with; empty for plain HTTP,
// which only a loopback address may use.
type apiTLS struct{ certFile, keyFile string }

// listenAPI opens the socket and, when listen names an address, the TCP listener. The home's
// lock must be held: a socket file left by a killed controller is removed.
func listenAPI(h home.Home, listen string, tlsFiles apiTLS) (*apiListeners, error) {
	l := &apiListeners{removeDir: func() {}}
	removeStaleSocketDir(h)
	path := h.SocketPath()
	if len(path) > maxSocketPath {
		// A fresh directory of random name, 0700, made by this process: no one else can
		// have put anything in it.
		dir, err := os.MkdirTemp("", socketDirPrefix)
		if err != nil {
			return nil, fmt.Errorf("controller API socket: %w", err)
		}
		path = filepath.Join(dir, "controller.sock")
		l.removeDir = func() { os.RemoveAll(dir) }
	} else if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale controller API socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		l.removeDir()
		return nil, fmt.Errorf("controller API socket %s: %w", path, err)
	}
	l.socket, l.socketPath = ln, path
	if err := l.listenTCP(h, listen, tlsFiles); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// listenTCP opens the TCP listener listen asks for, if any. Off loopback it must serve TLS: the
// token in every request would otherwise cross the network in clear text, and anyone on the
// path could replay it. The certificate is published in the home for clients to pin.
func (l *apiListeners) listenTCP(h home.Home, listen string, tlsFiles apiTLS) error {
	// A certificate left by an earlier controller would outlive the one it served.
	if err := os.Remove(h.CertPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if listen == "" || listen == ListenerOff {
		if tlsFiles != (apiTLS{}) {
			return errors.New("a TLS certificate for the controller API needs a TCP address to serve it on (--listen)")
		}
		return nil
	}
	if (tlsFiles.certFile == "") != (tlsFiles.keyFile == "") {
		return errors.New("the controller API's TLS needs both a certificate and a key")
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("controller API listen on %s: %w", listen, err)
	}
	l.tcp = ln
	if tlsFiles.certFile == "" {
		if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
			return fmt.Errorf("controller API on %s is not a loopback address: give it a TLS certificate and key (--api-tls-cert, --api-tls-key), or the token would cross the network in clear text", ln.Addr())
		}
		return nil
	}
	cert, err := tls.LoadX509KeyPair(tlsFiles.certFile, tlsFiles.keyFile)
	if err != nil {
		return fmt.Errorf("controller API TLS: %w", err)
	}
	l.tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	return publishCert(h, cert)
}

// publishCert writes the certificate chain, never the key, to the home's CertPath.
func publishCert(h home.Home, cert tls.Certificate) error {
	var buf []byte
	for _, der := range cert.Certificate {
		buf = append(buf, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	tmp := h.CertPath() + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o600); err != nil {
		return fmt.Errorf("publish the controller API certificate: %w", err)
	}
	return os.Rename(tmp, h.CertPath())
}

// removeStaleSocketDir removes the private socket directory a killed controller of h left.
func removeStaleSocketDir(h home.Home) {
	info, err := h.ReadInfo()
	if err != nil || info.Socket == "" || info.Socket == h.SocketPath() {
		return
	}
	dir := filepath.Dir(info.Socket)
	if filepath.Dir(dir) == filepath.Clean(os.TempDir()) && strings.HasPrefix(filepath.Base(dir), socketDirPrefix) {
		os.RemoveAll(dir)
	}
}

// tcpAddr is the TCP listener's address, "" without one.
func (l *apiListeners) tcpAddr() string {
	if l.tcp == nil {
		return ""
	}
	return l.tcp.Addr().String()
}

// serve serves srv on every listener; the channel gets each Serve's result.
func (l *apiListeners) serve(c *Controller, srv *api.Server) <-chan error {
	errs := make(chan error, 2)
	c.spawn(nil, "api server (socket)", func() { errs <- srv.Serve(l.socket) })
	switch {
	case l.tlsConfig != nil:
		c.spawn(nil, "api server (tls)", func() { errs <- srv.ServeTLS(l.tcp, l.tlsConfig) })
	case l.tcp != nil:
		c.spawn(nil, "api server (tcp)", func() { errs <- srv.Serve(l.tcp) })
	}
	return errs
}

// close closes listeners not yet served (Server.Shutdown closes served ones) and removes the
// socket and its private directory.
func (l *apiListeners) close() {
	l.socket.Close()
	if l.tcp != nil {
		l.tcp.Close()
	}
	l.removeDir()
}

// Package home locates Ferry's state directory (~/.ferry, or $FERRY_HOME) and the files in it
// that the CLI and the controller share. Everything in it is owner-only: the store holds
// secrets and the token file grants full control of the controller.
package home

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Env names the variable that overrides the state directory.
const Env = "FERRY_HOME"

// Home is one state directory.
type Home struct{ Dir string }

// Default returns $FERRY_HOME, or ~/.ferry.
func Default() (Home, error) {
	if d := os.Getenv(Env); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			return Home{}, err
		}
		return Home{Dir: abs}, nil
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return Home{}, fmt.Errorf("find home directory (set %s): %w", Env, err)
	}
	return Home{Dir: filepath.Join(h, ".ferry")}, nil
}

// Ensure creates the directory with mode 0700 (and tightens it if it exists).
func (h Home) Ensure() error {
	if err := os.MkdirAll(h.Dir, 0o700); err != nil {
		return err
	}
	return os.Chmod(h.Dir, 0o700)
}

// Paths of the shared files.
func (h Home) StorePath() string     { return filepath.Join(h.Dir, "ferry.db") }
func (h Home) TokenPath() string     { return filepath.Join(h.Dir, "controller.token") }
func (h Home) InfoPath() string      { return filepath.Join(h.Dir, "controller.json") }
func (h Home) LockPath() string      { return filepath.Join(h.Dir, "controller.lock") }
func (h Home) ControllerLog() string { return filepath.Join(h.Dir, "controller.log") }
func (h Home) LocalDir() string      { return filepath.Join(h.Dir, "local") }

// SocketPath is the controller API's Unix socket (0600, in the 0700 home): how the CLI and
// attached proxies on this machine reach the controller. It is the only listener unless the
// controller is asked for a TCP address too.
func (h Home) SocketPath() string { return filepath.Join(h.Dir, "controller.sock") }

// CertPath is the certificate the controller's TCP API serves with TLS, published so that a
// client reading this home can pin it (self-signed certificates included).
func (h Home) CertPath() string { return filepath.Join(h.Dir, "controller.crt") }

// Token returns the controller token, creating a random one (0600) on first use. A token file
// that others may read (copied in, or made by hand) is made owner-only again before its token
// is used: whoever reads it controls the controller.
func (h Home) Token() (string, error) { return h.token(h.TokenPath(), "controller token") }

// MetricsTokenPath is where a token for the controller's /metrics may be put; the controller
// never makes one (without it /metrics is open, as Prometheus scrapes usually are).
func (h Home) MetricsTokenPath() string { return filepath.Join(h.Dir, "metrics.token") }

// MetricsToken is the token in MetricsTokenPath, "" when there is no such file or it is empty.
// A file others may read is made private first, as the other tokens are.
func (h Home) MetricsToken() (string, error) {
	tok, err := readToken(h.MetricsTokenPath())
	if err != nil {
		return "", fmt.Errorf("metrics token: %w", err)
	}
	return tok, nil
}

// ProxyTokenPath is the attach token's file: the credential for attached proxies, which may
// follow services and report their load and nothing else (not create a service, whose `run`
// would execute anything on the controller's machines).
func (h Home) ProxyTokenPath() string { return filepath.Join(h.Dir, "proxy.token") }

// ProxyToken returns the attach token, creating a random one (0600) on first use; the
// controller does at start.
func (h Home) ProxyToken() (string, error) { return h.token(h.ProxyTokenPath(), "attach token") }

// AttachToken is the token an attached proxy sends: the attach token when the home holds one,
// else the controller token, which may do everything an attach token may. It creates neither:
// a proxy's home (a copy of controller.json, proxy.token and controller.crt on another
// machine) must not grow a controller token of its own.
func (h Home) AttachToken() (string, error) {
	for _, path := range []string{h.ProxyTokenPath(), h.TokenPath()} {
		tok, err := readToken(path)
		if err != nil {
			return "", err
		}
		if tok != "" {
			return tok, nil
		}
	}
	return "", fmt.Errorf("no token for an attached proxy in %s: copy %s there from the controller's FERRY_HOME", h.Dir, filepath.Base(h.ProxyTokenPath()))
}

// readToken reads the token in path, "" when the file does not exist or is empty; a file that
// others may read is made owner-only first.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", nil
	}
	if err := ownerOnly(path, 0o600); err != nil {
		return "", err
	}
	return tok, nil
}

// token reads the token in path, creating a random one on first use.
func (h Home) token(path, what string) (string, error) {
	tok, err := readToken(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if tok != "" {
		return tok, nil
	}
	if err := h.Ensure(); err != nil {
		return "", err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	tok = hex.EncodeToString(raw)
	// O_EXCL makes concurrent first uses agree: the loser reads the winner's token.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return waitToken(path)
	}
	if err != nil {
		return "", fmt.Errorf("create %s: %w", what, err)
	}
	defer f.Close()
	if _, err := f.WriteString(tok + "\n"); err != nil {
		return "", err
	}
	return tok, nil
}

// ownerOnly sets path's mode to perm if it grants anything to group or others.
func ownerOnly(path string, perm os.FileMode) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if info.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := chmod(path, perm); err != nil {
		// A Kubernetes Secret volume is read-only, and kubelet makes its files readable by the
		// pod's fsGroup: accepted, as long as others cannot read it.
		if errors.Is(err, syscall.EROFS) && info.Mode().Perm()&0o007 == 0 {
			return nil
		}
		return fmt.Errorf("%s is readable by others and cannot be made private: %w", path, err)
	}
	return nil
}

// chmod is os.Chmod; tests stand in for a read-only file system with it.
var chmod = os.Chmod

func waitToken(path string) (string, error) {
	for range 50 {
		b, err := os.ReadFile(path)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			return strings.TrimSpace(string(b)), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("%s exists but stays empty", path)
}

// Info is what a running controller publishes about itself.
type Info struct {
	PID int `json:"pid"`
	// Socket is the API's Unix socket: SocketPath, or a private directory of its own when that
	// path is too long for a socket.
	Socket string `json:"socket,omitempty"`
	// Addr is the API's TCP address, empty unless the controller was asked to listen on one.
	Addr string `json:"addr,omitempty"`
	// TLS says Addr serves HTTPS, with the certificate in CertPath.
	TLS       bool      `json:"tls,omitempty"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
}

// WriteInfo atomically replaces controller.json.
func (h Home) WriteInfo(info Info) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	tmp := h.InfoPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, h.InfoPath())
}

// ReadInfo reads controller.json; os.ErrNotExist when no controller ever ran here.
func (h Home) ReadInfo() (Info, error) {
	var info Info
	b, err := os.ReadFile(h.InfoPath())
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("read %s: %w", h.InfoPath(), err)
	}
	return info, nil
}

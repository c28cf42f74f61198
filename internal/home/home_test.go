package home

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode().Perm()
}

// TestTokenIsOwnerOnly: the first use creates the directory 0700 and a random token 0600; later
// uses read the same token.
func TestTokenIsOwnerOnly(t *testing.T) {
	h := Home{Dir: filepath.Join(t.TempDir(), "home")}
	tok, err := h.Token()
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) < 32 {
		t.Errorf("token %d characters, want at least 32", len(tok))
	}
	if m := mode(t, h.Dir); m != 0o700 {
		t.Errorf("home mode %o, want 700", m)
	}
	if m := mode(t, h.TokenPath()); m != 0o600 {
		t.Errorf("token mode %o, want 600", m)
	}
	again, err := h.Token()
	if err != nil || again != tok {
		t.Errorf("second Token() = %q, %v; want the first", again, err)
	}
	other, err := Home{Dir: filepath.Join(t.TempDir(), "other")}.Token()
	if err != nil || other == tok {
		t.Errorf("another home's token = %q, %v; want a different one", other, err)
	}
}

// TestLooseModesAreTightened: a home directory or token file that others could read is made
// owner-only again when it is used.
func TestLooseModesAreTightened(t *testing.T) {
	h := Home{Dir: filepath.Join(t.TempDir(), "home")}
	if err := os.Mkdir(h.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.TokenPath(), []byte("copied-token-0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(h.TokenPath(), 0o644); err != nil { // past the umask
		t.Fatal(err)
	}
	tok, err := h.Token()
	if err != nil || tok != "copied-token-0123456789abcdef" {
		t.Fatalf("Token() = %q, %v", tok, err)
	}
	if m := mode(t, h.TokenPath()); m != 0o600 {
		t.Errorf("token mode %o after use, want 600", m)
	}
	if err := h.Ensure(); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, h.Dir); m != 0o700 {
		t.Errorf("home mode %o after Ensure, want 700", m)
	}
}

// TestWriteInfoIsOwnerOnly: controller.json (pid and API address) is 0600.
func TestWriteInfoIsOwnerOnly(t *testing.T) {
	h := Home{Dir: t.TempDir()}
	if err := h.WriteInfo(Info{PID: 1, Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, h.InfoPath()); m != 0o600 {
		t.Errorf("controller.json mode %o, want 600", m)
	}
}

// TestAttachToken: an attached proxy sends the attach token when its home holds one, else the
// controller token; with neither it errs and creates no token of its own.
func TestAttachToken(t *testing.T) {
	h := Home{Dir: t.TempDir()}
	if _, err := h.AttachToken(); err == nil {
		t.Fatal("AttachToken in an empty home: no error")
	}
	for _, path := range []string{h.TokenPath(), h.ProxyTokenPath()} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("AttachToken created %s", path)
		}
	}
	full, err := h.Token()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := h.AttachToken(); err != nil || got != full {
		t.Fatalf("with only the controller token: %q, %v; want it", got, err)
	}
	scoped, err := h.ProxyToken()
	if err != nil {
		t.Fatal(err)
	}
	if scoped == full || len(scoped) < 32 {
		t.Fatalf("attach token %q: want a random one of its own", scoped)
	}
	if m := mode(t, h.ProxyTokenPath()); m != 0o600 {
		t.Errorf("proxy.token mode %o, want 600", m)
	}
	if got, err := h.AttachToken(); err != nil || got != scoped {
		t.Fatalf("with both: %q, %v; want the attach token", got, err)
	}
}

// TestSecretVolumeToken: a token on a read-only mount (a Kubernetes Secret volume, which kubelet
// makes readable by the pod's fsGroup) is used when only its group may read it, and refused
// when others may.
func TestSecretVolumeToken(t *testing.T) {
	chmod = func(string, os.FileMode) error { return &os.PathError{Op: "chmod", Err: syscall.EROFS} }
	t.Cleanup(func() { chmod = os.Chmod })
	tests := map[string]struct {
		mode    os.FileMode
		wantErr bool
	}{
		"group-readable, as kubelet mounts it": {mode: 0o440},
		"readable by others":                   {mode: 0o444, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := Home{Dir: t.TempDir()}
			if err := os.WriteFile(h.ProxyTokenPath(), []byte("mounted-token\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(h.ProxyTokenPath(), tc.mode); err != nil {
				t.Fatal(err)
			}
			tok, err := h.ProxyToken()
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "cannot be made private") {
					t.Fatalf("ProxyToken() = %q, %v; want the file refused", tok, err)
				}
				return
			}
			if err != nil || tok != "mounted-token" {
				t.Fatalf("ProxyToken() = %q, %v", tok, err)
			}
		})
	}
}

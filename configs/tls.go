package configs

import (
	"crypto/tls"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"
)

// tls reads {keyfile, certfile}. A leading ~ is the user's home. Under Load (the CLI) a
// relative path is resolved against the directory the CLI runs in, as SkyPilot resolves it
// (its HTTPS example, examples/serve/https/service.yaml, names
// examples/serve/https/key.pem and is launched from the repository's root), and both files are
// read and checked to be a matching key and certificate: the controller, whose working directory
// is not the user's, gets absolute paths, and --dry-run refuses what the launch would.
func (c *checker) tls(n *yaml.Node, field string) *TLS {
	f, ok := c.fields(n, field, tlsKeys)
	if !ok {
		return nil
	}
	out := &TLS{}
	good := true
	for _, k := range tlsKeys {
		kf := joinField(field, k)
		e, present := f[k]
		if !present {
			c.errorf(n, kf, "required: TLS needs both keyfile and certfile")
			good = false
			continue
		}
		v, ok := c.str(e.value, kf)
		if !ok {
			good = false
			continue
		}
		if v == "" {
			c.errorf(e.value, kf, "empty path")
			good = false
			continue
		}
		v = expandHome(v)
		if c.cwd != "" && !filepath.IsAbs(v) {
			v = filepath.Join(c.cwd, v)
		}
		if c.cwd != "" && !c.tlsFileExists(e.value, kf, v) {
			good = false
			continue
		}
		if k == "keyfile" {
			out.KeyFile = v
		} else {
			out.CertFile = v
		}
	}
	if !good {
		return nil
	}
	if c.cwd != "" {
		if _, err := tls.LoadX509KeyPair(out.CertFile, out.KeyFile); err != nil {
			c.errorf(n, field, "%s and %s are not a PEM certificate and its private key: %v", out.CertFile, out.KeyFile, err)
			return nil
		}
	}
	return out
}

// tlsFileExists reports whether path is a file the CLI can read, recording why not.
func (c *checker) tlsFileExists(at *yaml.Node, field, path string) bool {
	info, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		c.errorf(at, field, "%s does not exist (a relative path is resolved against %s, the directory ferry runs in, as SkyPilot does)", path, c.cwd)
		return false
	case err != nil:
		c.errorf(at, field, "%s cannot be read: %v", path, errors.Unwrap(err))
		return false
	case info.IsDir():
		c.errorf(at, field, "%s is a directory, not a PEM file", path)
		return false
	}
	return true
}

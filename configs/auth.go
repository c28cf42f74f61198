package configs

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

var (
	authKeys      = keysOf[Auth]()
	limitsKeys    = keysOf[Limits]()
	rateLimitKeys = keysOf[RateLimit]()
)

// Bounds on service.auth and service.limits.
const (
	// MinAPIKeyLength rejects keys short enough to guess online.
	MinAPIKeyLength = 16
	// maxKeysFileBytes bounds the keys file: it holds keys, not data.
	maxKeysFileBytes = 1 << 20
	// MaxRequestBodyMB caps limits.max_request_body_mb: the proxy buffers whole bodies.
	MaxRequestBodyMB = 1024
	// MaxQueueWaitSeconds caps limits.max_queue_wait_seconds: a client held longer than an
	// hour has long given up.
	MaxQueueWaitSeconds = 3600
	// MaxRateLimit caps limits.rate_limit_per_key's requests_per_second and burst: beyond a
	// million a second per key the limit is no limit, and a bound keeps the proxy's arithmetic
	// (nanoseconds per token) meaningful.
	MaxRateLimit = 1_000_000
	// MinRateLimitRPS is the slowest refill limits.rate_limit_per_key accepts: one request
	// every 1000 s. Slower is a key that should be revoked, not rate limited.
	MinRateLimitRPS = 0.001
)

// HashAPIKey is how a key is stored and compared: the hex SHA-256 of the key. Keys are long
// random strings, so an unsalted fast hash is enough to keep them out of the store and logs.
func HashAPIKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// auth reads service.auth. Keys are resolved only by Load (the CLI, which has the user's
// environment and files); Parse keeps the declaration and leaves KeyHashes to the caller. A key
// comes from a secret of the task or from the environment of the CLI, never from the task's
// envs: those are shown and kept in the clear, so naming one is an error.
func (c *checker) auth(n *yaml.Node, field string, envs, secrets map[string]string) *Auth {
	f, ok := c.fields(n, field, authKeys)
	if !ok {
		return nil
	}
	a := &Auth{}
	var seen map[string]bool
	add := func(key string, at *yaml.Node, fieldName, from string) {
		if len(key) < MinAPIKeyLength {
			c.errorf(at, fieldName, "the key %s is %d characters; API keys must be at least %d", from, len(key), MinAPIKeyLength)
			return
		}
		if strings.ContainsAny(key, " \t\r\n") {
			c.errorf(at, fieldName, "the key %s contains whitespace", from)
			return
		}
		h := HashAPIKey(key)
		if seen == nil {
			seen = map[string]bool{}
		}
		if !seen[h] {
			seen[h] = true
			a.KeyHashes = append(a.KeyHashes, h)
		}
	}
	if e, ok := f["keys_from_env"]; ok {
		c.keysFromEnv(a, e.value, joinField(field, "keys_from_env"), envs, secrets, add)
	}
	if e, ok := f["keys_file"]; ok {
		kf := joinField(field, "keys_file")
		if path, ok := c.str(e.value, kf); ok {
			if path == "" {
				c.errorf(e.value, kf, "empty path")
			} else {
				a.KeysFile = c.relativeToTask(expandHome(path))
				if c.lookupEnv != nil {
					c.readKeysFile(a.KeysFile, e.value, kf, add)
				}
			}
		}
	}
	badManaged := false
	if e, ok := f["managed_keys"]; ok {
		var valid bool
		a.ManagedKeys, valid = c.boolean(e.value, joinField(field, "managed_keys"))
		badManaged = !valid // said already
	}
	_, hasEnv := f["keys_from_env"]
	_, hasFile := f["keys_file"]
	if !hasEnv && !hasFile && !a.ManagedKeys && !badManaged {
		c.errorf(n, field, "give keys_from_env (environment variables holding keys), keys_file, managed_keys: true (the keys of `ferry keys create`), or several")
	}
	return a
}

// relativeToTask resolves a relative path against the task file's directory, as users expect of
// paths written in a file.
func (c *checker) relativeToTask(path string) string {
	if filepath.IsAbs(path) || c.file == "" {
		return path
	}
	return filepath.Join(filepath.Dir(c.file), path)
}

// readKeysFile reads one key per line; blank lines and lines starting with # are skipped. An
// error names the file's line, never the key.
func (c *checker) readKeysFile(path string, at *yaml.Node, field string, add func(key string, at *yaml.Node, field, from string)) {
	info, err := os.Stat(path)
	if err != nil {
		c.errorf(at, field, "cannot read the keys file: %v", err)
		return
	}
	if info.Size() > maxKeysFileBytes {
		c.errorf(at, field, "the keys file is %d bytes; at most %d", info.Size(), maxKeysFileBytes)
		return
	}
	data, err := os.ReadFile(path)
	if err != nil {
		c.errorf(at, field, "cannot read the keys file: %v", err)
		return
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	found := 0
	for line := 1; sc.Scan(); line++ {
		key := strings.TrimSpace(sc.Text())
		if key == "" || strings.HasPrefix(key, "#") {
			continue
		}
		found++
		add(key, at, field, "on line "+strconv.Itoa(line)+" of "+path)
	}
	if found == 0 {
		c.errorf(at, field, "the keys file %s holds no keys (one per line; # starts a comment)", path)
	}
}

// limits reads service.limits.
func (c *checker) limits(n *yaml.Node, field string) *Limits {
	f, ok := c.fields(n, field, limitsKeys)
	if !ok {
		return nil
	}
	l := &Limits{}
	if e, ok := f["max_request_body_mb"]; ok {
		lf := joinField(field, "max_request_body_mb")
		if v, ok := c.intAtLeast(e.value, lf, 1); ok {
			if v > MaxRequestBodyMB {
				c.errorf(e.value, lf, "at most %d (the proxy buffers whole request bodies in memory), got %d", MaxRequestBodyMB, v)
			} else {
				l.MaxRequestBodyMB = v
			}
		}
	}
	if e, ok := f["max_concurrent_requests"]; ok {
		l.MaxConcurrentRequests, _ = c.intAtLeast(e.value, joinField(field, "max_concurrent_requests"), 1)
	}
	if e, ok := f["idle_timeout_seconds"]; ok {
		l.IdleTimeoutSeconds, _ = c.intAtLeast(e.value, joinField(field, "idle_timeout_seconds"), 1)
	}
	if e, ok := f["max_queued_requests"]; ok {
		// -1 turns holding off: with no READY replica, requests get 503 at once.
		l.MaxQueuedRequests, _ = c.intAtLeast(e.value, joinField(field, "max_queued_requests"), -1)
	}
	if e, ok := f["max_queue_wait_seconds"]; ok {
		if v, ok := c.intBetween(e.value, joinField(field, "max_queue_wait_seconds"), 0, MaxQueueWaitSeconds); ok {
			l.MaxQueueWaitSeconds = v
		}
	}
	if e, ok := f["max_in_flight_per_replica"]; ok {
		// 0 learns each replica's batch size from its metrics; -1 turns late binding off.
		l.MaxInFlightPerReplica, _ = c.intAtLeast(e.value, joinField(field, "max_in_flight_per_replica"), -1)
	}
	if e, ok := f["rate_limit_per_key"]; ok {
		l.RateLimitPerKey = c.rateLimit(e, joinField(field, "rate_limit_per_key"))
	}
	if e, ok := f["max_concurrent_streams"]; ok {
		sf := joinField(field, "max_concurrent_streams")
		if v, ok := c.intAtLeast(e.value, sf, 1); ok {
			// Streams count as requests too: a stream cap above the request cap never bites.
			if l.MaxConcurrentRequests > 0 && v > l.MaxConcurrentRequests {
				c.errorf(e.value, sf, "must be at most max_concurrent_requests (%d), which streams count against too; got %d", l.MaxConcurrentRequests, v)
			} else {
				l.MaxConcurrentStreams = v
			}
		}
	}
	return l
}

// rateLimit reads limits.rate_limit_per_key: requests_per_second is required, burst defaults to
// one second's worth.
func (c *checker) rateLimit(e entry, field string) *RateLimit {
	f, ok := c.fields(e.value, field, rateLimitKeys)
	if !ok {
		return nil
	}
	r := &RateLimit{}
	rate, hasRate := f["requests_per_second"]
	if hasRate {
		rf := joinField(field, "requests_per_second")
		r.RequestsPerSecond, hasRate = c.numberAbove(rate.value, rf, 0, MaxRateLimit)
		if hasRate && r.RequestsPerSecond < MinRateLimitRPS {
			c.errorf(rate.value, rf, "must be at least %g (one request every %d seconds), got %s", MinRateLimitRPS, int(1/MinRateLimitRPS), rate.value.Value)
			hasRate = false
		}
	} else {
		c.errorf(e.keyNode, joinField(field, "requests_per_second"), "required: the rate each key's bucket refills at, in requests per second")
	}
	if b, ok := f["burst"]; ok {
		r.Burst, _ = c.intBetween(b.value, joinField(field, "burst"), 1, MaxRateLimit)
	} else if hasRate {
		r.Burst = max(1, int(math.Ceil(r.RequestsPerSecond)))
	}
	return r
}

// keysFromEnv reads auth.keys_from_env, n at field ef: a name or a list of environment
// variable names, each holding an API key; add takes each key found.
func (c *checker) keysFromEnv(a *Auth, n *yaml.Node, ef string, envs, secrets map[string]string, add func(key string, at *yaml.Node, fieldName, from string)) {
	v := c.deref(n)
	isList := v.Kind == yaml.SequenceNode
	items := []*yaml.Node{v}
	if isList {
		items = v.Content
	}
	for i, item := range items {
		itf := ef
		if isList {
			itf = indexField(ef, i)
		}
		name, ok := c.str(c.deref(item), itf)
		if !ok {
			continue
		}
		if !envNameRE.MatchString(name) {
			c.errorf(item, itf, "%s is not an environment variable name", quoteShort(name))
			continue
		}
		if _, inEnvs := envs[name]; inEnvs {
			c.errorf(item, itf, "%s is one of the task's envs (set in envs: or with --env), which serve up prints and the controller stores and returns as written: "+
				"make it a secret instead (under secrets:, or --secret %s=...), or leave it out of the task and export it in serve up's environment", name, name)
			continue
		}
		a.KeysFromEnv = append(a.KeysFromEnv, name)
		if c.lookupEnv == nil {
			continue
		}
		v, ok := secrets[name]
		if !ok || v == "" {
			v, ok = c.lookupEnv(name)
		}
		if !ok || v == "" {
			c.errorf(item, itf, "environment variable %s is not set: export it, or give it with --secret %s=...", name, name)
			continue
		}
		add(v, item, itf, "in $"+name)
	}
}

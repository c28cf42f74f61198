package configs

import (
	"maps"
	"slices"
	"strings"
)

// RedactedValue replaces every secret value in Redacted and ResolvedYAML output.
const RedactedValue = "<redacted>"

// Redacted returns a deep copy of t that is safe to print, log or send to a client: every
// secret value, every env named like a credential (CredentialEnv) or that keys_from_env reads an
// API key from (KeyEnvs), and every probe header that carries credentials (Authorization,
// cookies, tokens, API keys), is replaced by RedactedValue. t itself is not changed.
func (t *Task) Redacted() *Task {
	if t == nil {
		return nil
	}
	out := *t
	out.Resources = t.Resources.clone()
	out.Envs = maps.Clone(t.Envs)
	for _, name := range t.KeyEnvs() {
		out.Envs[name] = RedactedValue
	}
	for name := range t.Envs {
		if CredentialEnv(name) {
			out.Envs[name] = RedactedValue
		}
	}
	out.FileMounts = maps.Clone(t.FileMounts)
	out.MountModes = maps.Clone(t.MountModes)
	if t.Secrets != nil {
		out.Secrets = make(map[string]string, len(t.Secrets))
		for k := range t.Secrets {
			out.Secrets[k] = RedactedValue
		}
	}
	if t.Job != nil {
		j := *t.Job
		j.Recovery.RecoverOnExitCodes = slices.Clone(j.Recovery.RecoverOnExitCodes)
		out.Job = &j
	}
	if t.Service != nil {
		s := *t.Service
		s.ReplicaPolicy.TargetQPSPerAccelerator = maps.Clone(s.ReplicaPolicy.TargetQPSPerAccelerator)
		if s.ReadinessProbe.Headers != nil {
			h := make(map[string]string, len(s.ReadinessProbe.Headers))
			for k, v := range s.ReadinessProbe.Headers {
				if sensitiveHeader(k) {
					v = RedactedValue
				}
				h[k] = v
			}
			s.ReadinessProbe.Headers = h
		}
		if s.TLS != nil {
			tls := *s.TLS
			s.TLS = &tls
		}
		if s.Auth != nil {
			// Hashes are not keys, but nothing that shows a task needs them either.
			s.Auth = &Auth{KeysFromEnv: slices.Clone(s.Auth.KeysFromEnv), KeysFile: s.Auth.KeysFile}
		}
		if s.Limits != nil {
			limits := *s.Limits
			if r := limits.RateLimitPerKey; r != nil {
				rate := *r
				limits.RateLimitPerKey = &rate
			}
			s.Limits = &limits
		}
		if s.HealthCheck != nil {
			h := *s.HealthCheck
			s.HealthCheck = &h
		}
		out.Service = &s
	}
	scrubSecrets(&out, t.secretValues())
	return &out
}

// secretValues are the values Redacted scrubs from other fields: the secrets', and those of
// envs named like a credential of at least minScrubbed bytes (an env such as CACHE_KEY=1 must
// not turn every 1 in a path into <redacted>; its own value is hidden whatever its length).
func (t *Task) secretValues() []string {
	const minScrubbed = 4
	var out []string
	for _, v := range t.Secrets {
		out = append(out, v)
	}
	for k, v := range t.Envs {
		if CredentialEnv(k) && len(v) >= minScrubbed {
			out = append(out, v)
		}
	}
	return out
}

// CredentialEnv reports whether an env's name says its value is a credential: *_TOKEN, *_KEY,
// *_PAT, *_APIKEY and anything with SECRET, PASSWORD, PASSWD, CREDENTIAL or PRIVATE_KEY in it
// (HF_TOKEN, AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY, DB_PASSWORD, ...), in any case, as are
// TOKEN, APIKEY and API_KEY themselves. Such an env is treated as a secret everywhere but in its
// name: shown as RedactedValue, encrypted in the store, put in a Kubernetes Secret, and still
// given to the replica as written.
func CredentialEnv(name string) bool {
	n := strings.ToUpper(name)
	switch n {
	case "TOKEN", "APIKEY", "API_KEY", "PASSWORD":
		return true
	}
	for _, suffix := range []string{"_TOKEN", "_KEY", "_PAT", "_APIKEY"} {
		if strings.HasSuffix(n, suffix) {
			return true
		}
	}
	for _, word := range []string{"SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE_KEY"} {
		if strings.Contains(n, word) {
			return true
		}
	}
	return false
}

// SecretEnvNames are the names of the task's environment that are secrets, sorted: every
// secret and every env named like a credential (CredentialEnv). Infras that can keep secrets
// apart (a Kubernetes Secret) do so for all of them (launcher.Spec.SecretEnvs).
func (t *Task) SecretEnvNames() []string {
	if t == nil {
		return nil
	}
	var out []string
	for k := range t.Secrets {
		out = append(out, k)
	}
	for k := range t.Envs {
		if _, dup := t.Secrets[k]; !dup && CredentialEnv(k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// scrubSecrets replaces secret values that `$NAME` substitution put into workdir, file_mounts or
// the readiness probe (SkyPilot substitutes inline secrets too), so they are never shown.
func scrubSecrets(t *Task, secrets []string) {
	var pairs []string
	for _, v := range secrets {
		if v != "" {
			pairs = append(pairs, v, RedactedValue)
		}
	}
	if len(pairs) == 0 {
		return
	}
	r := strings.NewReplacer(pairs...)
	t.Workdir = r.Replace(t.Workdir)
	if t.FileMounts != nil {
		fm := make(map[string]string, len(t.FileMounts))
		for k, v := range t.FileMounts {
			fm[r.Replace(k)] = r.Replace(v)
		}
		t.FileMounts = fm
	}
	if t.MountModes != nil {
		modes := make(map[string]MountMode, len(t.MountModes))
		for k, v := range t.MountModes {
			modes[r.Replace(k)] = v
		}
		t.MountModes = modes
	}
	if t.Service != nil {
		p := &t.Service.ReadinessProbe
		p.Path, p.PostData = r.Replace(p.Path), r.Replace(p.PostData)
		for k, v := range p.Headers {
			p.Headers[k] = r.Replace(v)
		}
	}
}

// KeyEnvs are the names service.auth.keys_from_env takes API keys from that are also among the
// task's envs. Parsing refuses them, as envs are shown and stored as written; a task stored
// before that rule may still have them, and Redacted hides their values.
func (t *Task) KeyEnvs() []string {
	if t == nil || t.Service == nil || t.Service.Auth == nil {
		return nil
	}
	var out []string
	for _, name := range t.Service.Auth.KeysFromEnv {
		if _, ok := t.Envs[name]; ok {
			out = append(out, name)
		}
	}
	return out
}

// sensitiveHeader reports whether a header's value is a credential.
func sensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie", "set-cookie":
		return true
	}
	for _, word := range []string{"token", "secret", "key", "password", "auth", "session"} {
		if strings.Contains(n, word) {
			return true
		}
	}
	return false
}

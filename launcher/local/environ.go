package local

import (
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/launcher"
)

// A replica runs whatever its task says, so it gets no more of the controller's environment
// than a program needs to run at all: where programs and libraries are, whose home and locale
// it runs in, its temporary directory and which GPUs it may use. Whatever else it needs comes
// from its task (envs, secrets), where the user put it on purpose. The controller's own
// environment holds its cloud credentials and FERRY_ settings, and a controller run by hand
// holds the whole of its shell's: none of that may reach a program Ferry launches.

// baseEnv are the variables a replica inherits from the controller, besides every LC_*.
var baseEnv = []string{
	"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ", "LANG", "LANGUAGE",
	"LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "SSL_CERT_FILE", "SSL_CERT_DIR",
}

// BaseEnv reports whether a replica inherits the controller's value of the variable name. A
// controller started for the CLI must keep these, for the replicas' sake.
func BaseEnv(name string) bool {
	return slices.Contains(baseEnv, name) || strings.HasPrefix(name, "LC_")
}

// environ builds the replica's environment: the controller's BaseEnv variables, with
// PathPrepend first on PATH, a replica's SkyPilot node variables, then spec.Envs, then
// FERRY_PORT and FERRY_HOST, which the provider owns.
func (p *Provider) environ(spec launcher.Spec, host string, port int) []string {
	var env []string
	path := ""
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH":
			path = v
		case BaseEnv(k):
			env = append(env, kv)
		}
	}
	dirs := slices.Clone(p.opts.PathPrepend)
	if path != "" {
		dirs = append(dirs, path)
	}
	env = append(env, "PATH="+strings.Join(dirs, string(os.PathListSeparator)))
	if spec.Job == nil {
		// A replica is a one-node task to SkyPilot's programs; a task's envs may override.
		env = append(env, launcher.EnvNodeIPs+"="+host, launcher.EnvNodeRank+"=0", launcher.EnvNumNodes+"=1")
	}
	env = append(env, gpuShareEnv(spec)...) // gpushare.go; the task's own envs override it
	for _, k := range slices.Sorted(maps.Keys(spec.Envs)) {
		env = append(env, k+"="+spec.Envs[k])
	}
	if ckpt := p.checkpointDir(spec); ckpt != "" {
		env = append(env, launcher.EnvCheckpointDir+"="+ckpt)
	}
	// exec.Cmd keeps the last value of a duplicated key, so these win.
	return append(env, "FERRY_PORT="+strconv.Itoa(port), "FERRY_HOST="+host)
}

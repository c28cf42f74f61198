package testcluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ferryserve/ferry/bench/replicasim"
)

// runner is what the stand-in runs for a pod: a process (process.go), or with
// KubeletOptions.InProcessReplicas a replica-sim served in the stand-in's own process.
type runner interface {
	// exited reports whether it has ended.
	exited() bool
	// stop ends it, gracefully within grace where it can, and returns once it has ended.
	stop(grace time.Duration)
}

var (
	_ runner = (*process)(nil)
	_ runner = (*inProcessReplica)(nil)
)

// inProcessReplica is one pod's replica-sim served by the stand-in itself: one listener on the
// pod's IP and port. Where a process would exit (a flag it rejects, a port it cannot bind, a
// server error), it ends, says why in the pod's log, and is not restarted.
type inProcessReplica struct {
	cancel context.CancelFunc
	done   chan struct{} // closed once the server has returned
}

// startInProcess serves `ferry replica-sim ARGS` in this process, with ARGS (args after the
// "replica-sim" at args[0]) and the defaults the environment env (KEY=VALUE, later ones winning,
// then this process's own) would give the command. It logs to logPath as the command would.
func startInProcess(logPath string, env, args []string) (*inProcessReplica, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &inProcessReplica{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer log.Close()
		if err := serveReplicaSim(ctx, log, env, args); err != nil {
			fmt.Fprintf(log, "Error: %v\n", err)
		}
	}()
	return r, nil
}

// serveReplicaSim parses the command line as `ferry replica-sim` does and serves until ctx ends.
func serveReplicaSim(ctx context.Context, log *os.File, env, args []string) error {
	if len(args) == 0 || args[0] != "replica-sim" {
		return fmt.Errorf("in-process replica: command %q is not replica-sim", args)
	}
	cfg := replicasim.DefaultConfigFromEnv(envLookup(env))
	flags := pflag.NewFlagSet("replica-sim", pflag.ContinueOnError)
	flags.SetOutput(log)
	cfg.RegisterFlags(flags)
	if err := flags.Parse(args[1:]); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("unknown command %q for \"ferry replica-sim\"", flags.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("replica-sim: listen: %w", err)
	}
	fmt.Fprintf(log, "ferry replica-sim: serving model %q on http://%s (in the kubelet stand-in's process)\n", cfg.Model, ln.Addr())
	return replicasim.NewServer(cfg).Serve(ctx, ln)
}

// envLookup reads a variable from env (KEY=VALUE, the last one winning), else from this process's
// environment: what a process started with os.Environ() followed by env would see.
func envLookup(env []string) func(string) string {
	return func(name string) string {
		for i := len(env) - 1; i >= 0; i-- {
			if v, ok := strings.CutPrefix(env[i], name+"="); ok {
				return v
			}
		}
		return os.Getenv(name)
	}
}

func (r *inProcessReplica) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// stop shuts the server down as SIGTERM shuts the command down: in-flight requests finish at
// once. There is no SIGKILL for a goroutine, so grace is not needed: the server's own shutdown
// is bounded.
func (r *inProcessReplica) stop(time.Duration) {
	r.cancel()
	<-r.done
}

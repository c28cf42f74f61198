package local

import (
	"fmt"
	"strconv"
)

// Replicas that bind the wildcard address. An unmodified SkyPilot run binds 0.0.0.0:8000
// (`python -m http.server 8000`, `vllm serve --port 8000`), which holds the port on every
// address: the first replica would keep every other off it. So a fixed-port replica runs under
// a supervisor, the ferry binary re-executed as `ferry local-supervise`, which moves such binds
// to the replica's own address, as bypass4netns does for rootless containers: the workload runs
// under a seccomp filter that hands every bind(2) and connect(2) to the supervisor (user
// notification), and the supervisor binds a wildcard or loopback bind of the task's port, on a
// duplicate of the program's socket, to $FERRY_HOST instead, and connects a connect to
// localhost on that port there too (binder_linux.go). It performs every other bind too, with
// the address it read, so that no thread of the program can change the address after it was
// read; other connects and all other system calls go through untouched. A call it must leave
// to the kernel because of an error is logged, and if its loop ends the program's binds and
// connects fail (ENOSYS) rather than wait. The supervisor is not on the request path: the
// proxy's connections are accepted, not made, by the replica.
//
// The supervisor is the process the provider starts and records (pid and process group), so
// adoption, state and Terminate work as before: the workload and everything it starts stay in
// the supervisor's process group, so a signal to the group reaches the workload straight from
// the kernel; the supervisor catches it rather than sending it again (a second SIGTERM makes
// uvicorn, and so vLLM, skip its graceful shutdown), waits for the workload and ends as it
// did: same exit status, or killed by the same signal. Where seccomp user notification is
// unavailable, the workload runs as before and its log says so.
//
// With --netns the serving port goes into Ferry's private network (launcher/privnet): the
// bind of the task's port, on the wildcard, loopback or the replica's own address, gets a
// socket made there in place of the program's, and so do the replica's own connects to it
// (supervise_privnet_linux.go). The supervisor's connection to the network's helper keeps the
// helper running for as long as the replica runs, also after the controller that started it
// has gone.

// SuperviseCommand is the hidden ferry subcommand that runs Supervise; the ferry binary's main
// must dispatch it (with the arguments after it) before anything else reads the command line.
const SuperviseCommand = "local-supervise"

// superviseArgs is the command line, after the binary, that runs argv under a supervisor that
// moves binds of port on the wildcard or 127.0.0.1 to host; into Ferry's private network, whose
// helper listens at netns, unless netns is "".
func superviseArgs(host string, port int, netns string, argv []string) []string {
	args := []string{SuperviseCommand, "--addr", host, "--port", strconv.Itoa(port)}
	if netns != "" {
		args = append(args, "--netns", netns)
	}
	return append(append(args, "--"), argv...)
}

// superviseConfig is the parsed command line of SuperviseCommand.
type superviseConfig struct {
	// workload marks the second stage: the child that installs the filter, hands its listener
	// to the supervisor and execs argv.
	workload bool
	addr     string
	port     int
	// netns is the private network's helper socket (launcher/privnet); "" keeps the serving
	// port on the host's loopback.
	netns string
	argv  []string
}

func parseSuperviseArgs(args []string) (superviseConfig, error) {
	var c superviseConfig
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "--workload":
			c.workload = true
		case "--addr", "--port", "--netns":
			if i+1 >= len(args) {
				return c, fmt.Errorf("%s needs a value", a)
			}
			i++
			if a == "--addr" {
				c.addr = args[i]
			} else if a == "--netns" {
				c.netns = args[i]
			} else if p, err := strconv.Atoi(args[i]); err != nil || p <= 0 || p > 65535 {
				return c, fmt.Errorf("bad port %q", args[i])
			} else {
				c.port = p
			}
		case "--":
			c.argv = args[i+1:]
			if len(c.argv) == 0 {
				return c, fmt.Errorf("no command after --")
			}
			return c, nil
		default:
			return c, fmt.Errorf("unknown argument %q", a)
		}
	}
	return c, fmt.Errorf("no command (want -- ARGV...)")
}

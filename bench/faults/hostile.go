package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/procstat"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/replicas"
)

// Faults 8 and 9 come from clients, not from the service: clients that announce large request
// bodies without a valid API key and send none of it, and a flood of idle connections past the
// file-descriptor limits of a standalone proxy and of the controller, whose gateway it also
// targets. Both load and attack a keyed `ferry proxy --replica` that the scenario starts in
// front of the service's READY replicas: the bench's service has no API key, and a standalone
// proxy is a process of its own, so its memory and descriptors are the proxy's alone.

const (
	// benchKeyEnv holds benchKey for the standalone proxy's --api-key-env.
	benchKeyEnv = "FAULTS_BENCH_KEY"
	benchKey    = "sk-faults-bench-0123456789abcdef"
	wrongKey    = "sk-faults-wrong-0123456789abcdef"
	// maxProxyRSS is the target for the proxy under the body attack.
	maxProxyRSS = 256 << 20
	// The body attack: most clients announce the default 32 MiB limit with a wrong key, a few
	// announce 1 GiB (the proxy runs with --max-body-mb 1024) with no key; none sends a byte.
	attackBody     = 32 << 20
	hugeAttackBody = 1 << 30
	hugeAttackers  = 3
	// attackAnswerWithin is how soon an unauthenticated request must be answered.
	attackAnswerWithin = time.Second
	// attackPause is each attacker's pause between two requests.
	attackPause = 20 * time.Millisecond
	// rssEvery is how often the attacked proxy's VmRSS is read.
	rssEvery = 100 * time.Millisecond
	// Descriptor limits of the flood scenario: the standalone proxy's, and the controller's,
	// which is restarted under it.
	proxyNofile      = 512
	controllerNofile = 1024
	// servedAgainWithin bounds how long after the flood each target must serve a new connection.
	servedAgainWithin = 10 * time.Second
)

// standaloneProxy is a `ferry proxy --replica` the scenario started.
type standaloneProxy struct {
	proc    *childproc.Proc
	addr    string
	metrics string
	nofile  int // 0: the bench's own limit
}

// withNofile runs argv under RLIMIT_NOFILE n, soft and hard, so the Go runtime cannot raise it.
func withNofile(n int, argv []string) []string {
	return append([]string{"/bin/sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, n)}, argv...)
}

// startStandalone starts a keyed `ferry proxy` in front of the service's READY replicas, under
// the descriptor limit nofile (0: the bench's), and waits until it serves a keyed request.
func (b *bench) startStandalone(ctx context.Context, name string, nofile int, extra ...string) (*standaloneProxy, error) {
	st, err := b.f.Status(ctx)
	if err != nil {
		return nil, err
	}
	sp := &standaloneProxy{nofile: nofile}
	if sp.addr, err = benchkit.FreeLoopbackAddr(); err != nil {
		return nil, err
	}
	if sp.metrics, err = benchkit.FreeLoopbackAddr(); err != nil {
		return nil, err
	}
	argv := []string{b.f.Bin, "proxy", "--name", serviceName, "--listen", sp.addr, "--metrics-listen", sp.metrics, "--api-key-env", benchKeyEnv}
	for _, r := range st.Replicas {
		if r.Status == replicas.StatusReady && r.Endpoint != "" {
			argv = append(argv, "--replica", r.Endpoint)
		}
	}
	argv = append(argv, extra...)
	if nofile > 0 {
		argv = withNofile(nofile, argv)
	}
	env := append(append([]string(nil), b.f.Env...), benchKeyEnv+"="+benchKey)
	if sp.proc, err = b.f.Group.Start(childproc.Spec{Name: name, Argv: argv, Env: env, CPU: -1}); err != nil {
		return nil, err
	}
	if err := b.waitServes(ctx, sp.addr, benchKey, sp.proc); err != nil {
		b.f.Group.Stop(sp.proc)
		return nil, fmt.Errorf("`ferry proxy --listen %s` (%s): %w", sp.addr, name, err)
	}
	return sp, nil
}

// alive reports whether the proxy's process still runs.
func (sp *standaloneProxy) alive() bool {
	select {
	case <-sp.proc.Exited():
		return false
	default:
		return true
	}
}

// openFileLimit reads a process's "Max open files" soft limit from /proc.
func openFileLimit(pid int) (int, error) {
	b, err := os.ReadFile(filepath.Join(servicekit.ProcRoot, strconv.Itoa(pid), "limits"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, errors.New("no \"Max open files\" in /proc/PID/limits")
}

// restartControllerLimited stops the controller and starts a new one (through `ferry serve
// status`, as any CLI command does) under RLIMIT_NOFILE nofile. Its replicas keep running and
// are adopted.
func (b *bench) restartControllerLimited(ctx context.Context, nofile int, res *scenarioResult) error {
	if _, err := b.f.Run(ctx, "controller-stop-nofile", cliTimeout, "controller", "stop"); err != nil {
		return err
	}
	if err := servicekit.PollUntil(ctx, cliTimeout, pollEvery, func() (bool, error) {
		pid, err := b.f.ControllerPID()
		return pid == 0, err
	}); err != nil {
		return fmt.Errorf("the controller did not stop: %w", err)
	}
	argv := withNofile(nofile, []string{b.f.Bin, "serve", "status", serviceName})
	p, err := b.f.Group.Start(childproc.Spec{Name: "serve-status-nofile", Argv: argv, Env: b.f.Env, CPU: -1})
	if err != nil {
		return err
	}
	if err := servicekit.WaitExit(ctx, b.f.Group, p, cliTimeout); err != nil {
		return err
	}
	if err := servicekit.PollUntil(ctx, cliTimeout, pollEvery, func() (bool, error) {
		_, err := b.f.Status(ctx)
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("controller API after the restart: %w", err)
	}
	pid, _ := b.f.ControllerPID()
	limit, err := openFileLimit(pid)
	if err != nil {
		return err
	}
	res.Notes = append(res.Notes, fmt.Sprintf("the controller (pid %d) restarted with a limit of %d open files, its gateway on %s", pid, limit, b.f.gatewayAddr))
	return nil
}

// bodyAttackResult is what the body attack saw.
type bodyAttackResult struct {
	Clients int `json:"clients"`
	Sent    int `json:"sent"`
	// Refused were answered 401 (or 429, past the failed-key burst) within attackAnswerWithin;
	// Slow later; Unanswered never, before the attacker gave up.
	Refused    int            `json:"refused_at_once"`
	Slow       int            `json:"answered_late"`
	Unanswered int            `json:"unanswered"`
	Other      map[string]int `json:"other_answers,omitempty"`
	// BaseRSS is the proxy's VmRSS before the attack, PeakRSS the most sampled during it, HWM
	// its VmHWM (peak over its life) after; bytes.
	BaseRSS uint64 `json:"base_rss"`
	PeakRSS uint64 `json:"peak_rss"`
	HWM     uint64 `json:"hwm"`
}

// attackBodies runs the body attack on the standalone proxy for the scenario's duration.
func (b *bench) attackBodies(ctx context.Context, res *scenarioResult) (time.Time, error) {
	sp := b.standalone
	r := &bodyAttackResult{Clients: b.opts.bodyClients + hugeAttackers, Other: map[string]int{}}
	res.Bodies = r
	if m, err := procstat.ReadMemory(servicekit.ProcRoot, sp.proc.PID); err == nil {
		r.BaseRSS = m.RSS
	}
	b.progress("scenario %s: %d clients announce %d MiB bodies with a wrong key and %d announce %d MiB with none, sending nothing, for %v",
		res.Key, b.opts.bodyClients, attackBody>>20, hugeAttackers, hugeAttackBody>>20, b.opts.bodyFor)
	end := time.Now().Add(b.opts.bodyFor)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range r.Clients {
		key, size := wrongKey, attackBody
		if i < hugeAttackers {
			key, size = "", hugeAttackBody
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				outcome := announceBody(sp.addr, key, size)
				mu.Lock()
				r.count(outcome)
				mu.Unlock()
				time.Sleep(attackPause)
			}
		}()
	}
	for time.Now().Before(end) && ctx.Err() == nil {
		if m, err := procstat.ReadMemory(servicekit.ProcRoot, sp.proc.PID); err == nil {
			r.PeakRSS = max(r.PeakRSS, m.RSS)
		}
		_ = servicekit.SleepCtx(ctx, rssEvery)
	}
	wg.Wait()
	if m, err := procstat.ReadMemory(servicekit.ProcRoot, sp.proc.PID); err == nil {
		r.PeakRSS, r.HWM = max(r.PeakRSS, m.RSS), m.HWM
	}
	b.progress("scenario %s: %d unauthenticated requests: %d refused at once, %d late, %d unanswered; proxy RSS %d MiB before, at most %d MiB during (VmHWM %d MiB)",
		res.Key, r.Sent, r.Refused, r.Slow, r.Unanswered, r.BaseRSS>>20, r.PeakRSS>>20, r.HWM>>20)
	return time.Now(), ctx.Err()
}

func (r *bodyAttackResult) count(outcome string) {
	r.Sent++
	switch outcome {
	case "refused":
		r.Refused++
	case "slow":
		r.Slow++
	case "unanswered":
		r.Unanswered++
	default:
		r.Other[outcome]++
	}
}

// announceBody sends the headers of a chat completion announcing a body of size bytes, with key
// (none when empty), and no body; it says how the proxy answered.
func announceBody(addr, key string, size int) string {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer conn.Close()
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", servicekit.ChatPath, addr, auth, size); err != nil {
		return "write: " + err.Error()
	}
	_ = conn.SetReadDeadline(start.Add(2 * attackAnswerWithin))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "unanswered"
		}
		return "read: " + err.Error()
	}
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusTooManyRequests:
		return fmt.Sprintf("status %d", resp.StatusCode)
	case time.Since(start) > attackAnswerWithin:
		return "slow"
	}
	return "refused"
}

// connFloodResult is what the connection flood saw at one target.
type connFloodResult struct {
	Target string `json:"target"`
	// FDLimit is the target process's limit of open files.
	FDLimit int `json:"fd_limit"`
	Conns   int `json:"connections"`
	// Opened connections completed their handshake (the kernel's backlog takes them before the
	// process accepts); of those, Refused got an OpenAI-shaped 503/429 and were closed, Closed
	// were closed without one, and Held were open, unanswered, when the flood ended.
	Opened  int `json:"opened"`
	Refused int `json:"refused"`
	Closed  int `json:"closed"`
	Held    int `json:"held"`
	// Alive is whether the same process still ran after the flood; ServedAfterS how long after
	// the flood's end it first served a request on a new connection (-1: not within
	// servedAgainWithin).
	Alive        bool    `json:"alive"`
	ServedAfterS float64 `json:"served_after_s"`
	// LastError is the last failed request of that wait, if it never succeeded.
	LastError string `json:"last_error,omitempty"`
}

// floodTarget is one process the connection flood hits.
type floodTarget struct {
	name, addr string
	alive      func() bool
	serve      func() error // one request on a new connection
	res        *connFloodResult
}

// floodConnections floods the standalone proxy and the controller's gateway at once with idle
// connections, more than either has descriptors, holds them, closes them, and measures how soon
// each serves a new connection again.
func (b *bench) floodConnections(ctx context.Context, res *scenarioResult) (time.Time, error) {
	targets, err := b.floodTargets()
	if err != nil {
		return time.Time{}, err
	}
	b.progress("scenario %s: %d idle connections each to the standalone proxy (limit %d open files) and the gateway (limit %d), over %v, held %v",
		res.Key, b.opts.connFlood, targets[0].res.FDLimit, targets[1].res.FDLimit, b.opts.floodRamp, b.opts.floodHold)
	var wg sync.WaitGroup
	for _, t := range targets {
		res.ConnFloods = append(res.ConnFloods, t.res)
		wg.Add(1)
		go func() {
			defer wg.Done()
			floodIdle(ctx, t.addr, b.opts.connFlood, b.opts.floodRamp, b.opts.floodHold, t.res)
		}()
	}
	wg.Wait()
	ended := time.Now()
	for _, t := range targets {
		t.res.Alive = t.alive()
		t.res.ServedAfterS = -1
	}
	_ = servicekit.PollUntil(ctx, servedAgainWithin, 50*time.Millisecond, func() (bool, error) {
		done := true
		for _, t := range targets {
			if t.res.ServedAfterS >= 0 {
				continue
			}
			if err := t.serve(); err != nil {
				t.res.LastError = err.Error()
			} else {
				t.res.ServedAfterS, t.res.LastError = time.Since(ended).Seconds(), ""
			}
			done = done && t.res.ServedAfterS >= 0
		}
		return done, nil
	})
	if n := strings.Count(servicekit.ReadLog(b.standalone.proc), "accepting a connection failed"); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("the standalone proxy logged %d accept errors it waited out (EMFILE; the log is sampled)", n))
	}
	for _, t := range targets {
		t.res.Alive = t.res.Alive && t.alive()
		b.progress("scenario %s: %s: %d opened, %d refused, %d closed, %d held; alive %v, served a new connection %s after the flood",
			res.Key, t.name, t.res.Opened, t.res.Refused, t.res.Closed, t.res.Held, t.res.Alive, secsOrNever(t.res.ServedAfterS))
	}
	return ended, ctx.Err()
}

// floodTargets are the standalone proxy and the controller's gateway.
func (b *bench) floodTargets() ([]*floodTarget, error) {
	sp := b.standalone
	ctlPID, err := b.f.ControllerPID()
	if err != nil {
		return nil, err
	}
	proxyLimit, _ := openFileLimit(sp.proc.PID)
	ctlLimit, _ := openFileLimit(ctlPID)
	return []*floodTarget{
		{name: "standalone proxy", addr: sp.addr, alive: sp.alive,
			serve: func() error { return oneRequest(sp.addr, benchKey, "") },
			res:   &connFloodResult{Target: "ferry proxy --replica " + sp.addr, FDLimit: proxyLimit, Conns: b.opts.connFlood}},
		{name: "gateway", addr: b.f.gatewayAddr,
			alive: func() bool { pid, err := b.f.ControllerPID(); return err == nil && pid == ctlPID },
			serve: func() error { return oneRequest(b.f.gatewayAddr, "", modelName) },
			res:   &connFloodResult{Target: "controller gateway " + b.f.gatewayAddr, FDLimit: ctlLimit, Conns: b.opts.connFlood}},
	}, nil
}

// floodIdle opens n idle connections to addr over ramp, keeps them until hold has passed since
// the last was opened, reading whatever the server answers, then closes them all.
func floodIdle(ctx context.Context, addr string, n int, ramp, hold time.Duration, res *connFloodResult) {
	var opened, refused, closed atomic.Int64
	var conns []net.Conn
	var wg sync.WaitGroup
	gap := ramp / time.Duration(max(n, 1))
	for range n {
		if ctx.Err() != nil {
			break
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			opened.Add(1)
			conns = append(conns, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				answer, err := bufio.NewReader(c).ReadString('\n')
				switch {
				case strings.Contains(answer, " 503 ") || strings.Contains(answer, " 429 "):
					refused.Add(1)
				case err != nil && !errors.Is(err, net.ErrClosed):
					closed.Add(1)
				}
			}()
		}
		time.Sleep(gap)
	}
	_ = servicekit.SleepCtx(ctx, hold)
	for _, c := range conns {
		_ = c.Close()
	}
	wg.Wait()
	res.Opened, res.Refused, res.Closed = int(opened.Load()), int(refused.Load()), int(closed.Load())
	res.Held = res.Opened - res.Refused - res.Closed
}

// oneRequest sends one non-streamed chat completion on a new connection, with key and model
// when given.
func oneRequest(addr, key, model string) error {
	body := `{"messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":1}`
	if model != "" {
		body = `{"model":"` + model + `",` + body[1:]
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+servicekit.ChatPath, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return nil
}

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/loadgen"
	"github.com/ferryserve/ferry/bench/procstat"
)

const (
	// readyTimeout bounds a child's start.
	readyTimeout = 30 * time.Second
	// manyStreamsChunks is the length of each stream in the memory test.
	manyStreamsChunks = 32
	// memorySampleEvery is how often the memory test reads the proxy's RSS.
	memorySampleEvery = 200 * time.Millisecond
)

// target is one path to the backend: direct, or through a proxy process.
type target struct {
	name string
	addr string
	proc *childproc.Proc // nil for direct
}

// bench holds the running processes and collects measurements.
type bench struct {
	opts     options
	group    *childproc.Group
	ctx      context.Context
	report   *report
	backends []string // host:port of every backend listener
	targets  map[string]*target
	// collector is the OTLP collector stand-in ferry-otlp exports to; nil until needed.
	collector *collector
}

func (b *bench) cpu(proxy bool) int {
	if !b.opts.pinned() {
		return -1
	}
	if proxy {
		return b.opts.proxyCPU
	}
	return b.opts.loadCPU
}

// startBackend runs this binary's backend subcommand pinned next to the load generator,
// listening on as many ports as the largest replica set the run uses.
func (b *bench) startBackend() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	n := b.opts.backends
	if b.opts.streams5k > 0 {
		n = max(n, b.opts.streams5kBackends)
	}
	argv := []string{self, "backend", "--chunks", fmt.Sprint(b.opts.chunks), "--chunk-gap", b.opts.chunkGap.String()}
	for range n {
		addr, err := benchkit.FreeLoopbackAddr()
		if err != nil {
			return err
		}
		b.backends = append(b.backends, addr)
		argv = append(argv, "--listen", addr)
	}
	p, err := b.group.Start(childproc.Spec{Name: "backend", Argv: argv, CPU: b.cpu(false)})
	if err != nil {
		return err
	}
	for _, addr := range b.backends {
		if err := childproc.WaitHTTP(b.ctx, p, "http://"+addr+"/health", readyTimeout); err != nil {
			return err
		}
	}
	// Direct is the load generator on the first backend port, with no proxy.
	b.targets = map[string]*target{targetDirect: {name: targetDirect, addr: b.backends[0]}}
	return nil
}

// startTarget starts (or restarts) the named proxy in front of the given backend addresses,
// pinned to the proxy CPU, and waits until GET /health through it succeeds.
func (b *bench) startTarget(name string, upstreams []string) error {
	if old := b.targets[name]; old != nil && old.proc != nil {
		b.group.Stop(old.proc)
	}
	addr, err := benchkit.FreeLoopbackAddr()
	if err != nil {
		return err
	}
	var argv []string
	switch name {
	case targetFerry, targetFerryOTLP:
		// Metrics on, as under a controller: the measured cost includes counting every request.
		argv = []string{b.opts.ferryBin, "proxy", "--listen", addr, "--metrics-listen", "127.0.0.1:0"}
		for _, u := range upstreams {
			argv = append(argv, "--replica", u)
		}
		if b.opts.ferryPolicy != "" {
			argv = append(argv, "--policy", b.opts.ferryPolicy)
		}
		if name == targetFerryOTLP {
			if b.collector == nil {
				if b.collector, err = startCollector(); err != nil {
					return err
				}
			}
			argv = append(argv, "--otlp-endpoint", b.collector.url, "--trace-sample", "1")
		}
	case targetNginx:
		bin, err := nginxBinary()
		if err != nil {
			return err
		}
		prefix := filepath.Join(b.opts.out, "nginx")
		argv, err = writeNginxConfig(bin, nginxConfig{
			Prefix:            prefix,
			Listen:            addr,
			Upstreams:         upstreams,
			WorkerConnections: 4*max(b.opts.streams5k, b.opts.concurrency, b.opts.streamConcurrency) + 1024,
			ErrorLog:          filepath.Join(b.opts.out, "logs", "nginx-error.log"),
		})
		if err != nil {
			return err
		}
	case targetPass, targetEpoll:
		self, err := os.Executable()
		if err != nil {
			return err
		}
		argv = []string{self, name, "--listen", addr}
		for _, u := range upstreams {
			argv = append(argv, "--upstream", u)
		}
	default:
		return fmt.Errorf("unknown target %q", name)
	}
	p, err := b.group.Start(childproc.Spec{Name: name, Argv: argv, CPU: b.cpu(true)})
	if err != nil {
		return err
	}
	if err := childproc.WaitHTTP(b.ctx, p, "http://"+addr+"/health", readyTimeout); err != nil {
		return err
	}
	b.targets[name] = &target{name: name, addr: addr, proc: p}
	return nil
}

// measureAll runs every scenario on every target, rotating the target order each repetition so
// that drift on a shared machine spreads over all of them.
func (b *bench) measureAll() error {
	for rep := range b.opts.reps {
		order := rotate(b.opts.targets, rep)
		for _, scenario := range b.opts.scenarios {
			for _, name := range order {
				m, err := b.measure(scenario, b.targets[name], rep)
				if err != nil {
					return fmt.Errorf("%s through %s: %w", scenario, name, err)
				}
				fmt.Fprintf(os.Stderr, "rep %d %-9s %-6s %s\n", rep+1, scenario, name, m.oneLine())
				b.report.add(m)
			}
		}
	}
	return nil
}

// rotate returns s started at index k mod len(s).
func rotate(s []string, k int) []string {
	if len(s) == 0 {
		return nil
	}
	k %= len(s)
	return append(append([]string(nil), s[k:]...), s[:k]...)
}

// cpuSnapshot is the counters read at both ends of a measured window.
type cpuSnapshot struct {
	at    time.Time
	proxy time.Duration // CPU of the proxy's process group; zero for direct
	cores map[int]procstat.CoreTimes
}

func (b *bench) snapshot(t *target) (cpuSnapshot, error) {
	s := cpuSnapshot{at: time.Now()}
	if t.proc != nil {
		cpu, pids, err := procstat.GroupCPU("/proc", t.proc.PID)
		if err != nil {
			return s, err
		}
		if len(pids) == 0 {
			return s, fmt.Errorf("%s (pid %d) is not running: %s", t.name, t.proc.PID, t.proc.LogTail(400))
		}
		s.proxy = cpu
	}
	cores, err := procstat.ReadCoreTimes("/proc")
	if err != nil {
		return s, err
	}
	s.cores = cores
	return s, nil
}

// measure runs one scenario against one target: a warm-up, then the measured window, with the
// proxy's CPU time and both cores' busy time read at its ends.
func (b *bench) measure(scenario string, t *target, rep int) (measurement, error) {
	conc := b.opts.concurrency
	if scenario == scenarioStream {
		conc = b.opts.streamConcurrency
	}
	client, err := loadgen.NewClient(t.addr, conc, b.opts.timeout)
	if err != nil {
		return measurement{}, err
	}
	defer client.CloseIdleConnections()
	op := nonStreamOp(client)
	if scenario == scenarioStream {
		op = streamOp(client, b.opts.chunks, b.opts.chunkGap)
	}
	if b.opts.warmup > 0 {
		if _, err := loadgen.Run(b.ctx, loadgen.Config{Concurrency: conc, Duration: b.opts.warmup}, op); err != nil {
			return measurement{}, err
		}
	}
	before, err := b.snapshot(t)
	if err != nil {
		return measurement{}, err
	}
	res, err := loadgen.Run(b.ctx, loadgen.Config{Concurrency: conc, Duration: b.opts.duration, MaxRequests: b.opts.requests}, op)
	if err != nil {
		return measurement{}, err
	}
	after, err := b.snapshot(t)
	if err != nil {
		return measurement{}, err
	}
	return newMeasurement(scenario, t.name, rep, res, before, after, b.opts), nil
}

// measureManyStreams restarts the named proxy (so that its peak RSS belongs to this test) in
// front of opts.streams5kBackends backend ports, and holds opts.streams5k streams open through
// it at once, sampling its resident memory.
func (b *bench) measureManyStreams(name string) error {
	if err := b.startTarget(name, b.backends[:b.opts.streams5kBackends]); err != nil {
		return err
	}
	t := b.targets[name]
	n := b.opts.streams5k
	client, err := loadgen.NewClient(t.addr, n, b.opts.timeout+time.Duration(manyStreamsChunks)*b.opts.streams5kGap)
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	idle, err := procstat.GroupMemory("/proc", t.proc.PID)
	if err != nil {
		return err
	}
	before, err := b.snapshot(t)
	if err != nil {
		return err
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var peakRSS uint64
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(memorySampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if m, err := procstat.GroupMemory("/proc", t.proc.PID); err == nil {
					peakRSS = max(peakRSS, m.RSS)
				}
			}
		}
	}()
	streamLen := time.Duration(manyStreamsChunks-1) * b.opts.streams5kGap
	cfg := loadgen.Config{
		Concurrency: n,
		// Every worker starts exactly one stream; the duration only has to outlast the ramp.
		Duration:    b.opts.streams5kRamp + streamLen + b.opts.timeout,
		MaxRequests: int64(n),
		Ramp:        b.opts.streams5kRamp,
	}
	fmt.Fprintf(os.Stderr, "memory test: %d streams through %s, opened over %v, each %v long\n", n, name, cfg.Ramp, streamLen)
	if streamLen <= cfg.Ramp {
		fmt.Fprintf(os.Stderr, "warning: streams last %v, no longer than the %v ramp, so they will not all be open at once; raise --streams5k-gap\n", streamLen, cfg.Ramp)
	}
	res, err := loadgen.Run(b.ctx, cfg, streamOp(client, manyStreamsChunks, b.opts.streams5kGap))
	close(stop)
	wg.Wait()
	if err != nil {
		return err
	}
	after, err := b.snapshot(t)
	if err != nil {
		return err
	}
	end, err := procstat.GroupMemory("/proc", t.proc.PID)
	if err != nil {
		return err
	}
	m := manyStreams{
		Target:       name,
		Streams:      n,
		OK:           res.Requests,
		Errors:       res.Errors,
		FirstError:   res.FirstError,
		PeakInFlight: res.PeakInFlight,
		ElapsedS:     res.Elapsed.Seconds(),
		IdleRSSMiB:   mib(idle.RSS),
		PeakRSSMiB:   mib(max(peakRSS, end.RSS)),
		HWMMiB:       mib(end.HWM),
		CPUSeconds:   (after.proxy - before.proxy).Seconds(),
		TTFB:         res.TTFB.Summarize(),
		Total:        res.Latency.Summarize(),
	}
	if res.Requests > 0 {
		m.CPUPerStreamUs = float64((after.proxy - before.proxy).Microseconds()) / float64(res.Requests)
	}
	fmt.Fprintf(os.Stderr, "memory test %s: %d/%d ok, peak in flight %d, peak RSS %.1f MiB, VmHWM %.1f MiB\n",
		name, m.OK, n, m.PeakInFlight, m.PeakRSSMiB, m.HWMMiB)
	b.report.addManyStreams(m)
	return nil
}

func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

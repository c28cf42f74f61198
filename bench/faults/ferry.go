package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver, to read the controller's store

	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/procstat"
	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
)

// procRoot is where process state is read.
const procRoot = "/proc"

// ferry drives one FERRY_HOME: the CLI as child processes (each in its own process group,
// logged under logs/), the controller's API for status, its metrics listener for goroutines
// and ejections, /proc for its file descriptors, the local launcher's instance files for the
// replica processes, and the SQLite store, read-only, for leftover rows.
type ferry struct {
	bin         string
	home        home.Home
	env         []string
	group       *childproc.Group
	metricsAddr string // the controller's metrics listener
	http        *http.Client

	mu sync.Mutex
	// seen is every local replica instance observed during the run, by instance id, so that
	// a process whose instance directory is gone can still be found by the leak checks.
	seen map[string]instance
}

func newFerry(bin, homeDir, metricsAddr string, group *childproc.Group) (*ferry, error) {
	abs, err := filepath.Abs(homeDir)
	if err != nil {
		return nil, err
	}
	h := home.Home{Dir: abs}
	if err := h.Ensure(); err != nil {
		return nil, err
	}
	env := []string{
		home.Env + "=" + abs,
		// Other sessions on this machine use the default gateway and metrics ports.
		"FERRY_GATEWAY_ADDR=off",
		"FERRY_METRICS_ADDR=" + metricsAddr,
		// Replicas' run lines call `ferry replica-sim`: the binary under test must come first.
		"PATH=" + filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
	}
	return &ferry{bin: bin, home: h, env: env, group: group, metricsAddr: metricsAddr,
		http: &http.Client{Timeout: 2 * time.Second}, seen: map[string]instance{}}, nil
}

// start runs `ferry ARGS` in the background; its output goes to logs/NN-name.log.
func (f *ferry) start(name string, args ...string) (*childproc.Proc, error) {
	return f.group.Start(childproc.Spec{Name: name, Argv: append([]string{f.bin}, args...), Env: f.env, CPU: -1})
}

// run runs `ferry ARGS` to its end, at most timeout, and returns its output. A non-zero exit
// is an error that quotes the output's last lines.
func (f *ferry) run(ctx context.Context, name string, timeout time.Duration, args ...string) (string, error) {
	p, err := f.start(name, args...)
	if err != nil {
		return "", err
	}
	err = waitExit(ctx, f.group, p, timeout)
	out := readLog(p)
	if err != nil {
		return out, fmt.Errorf("ferry %s: %w", strings.Join(args, " "), err)
	}
	if p.Err() != nil {
		return out, fmt.Errorf("ferry %s: %w: %s", strings.Join(args, " "), p.Err(), lastLines(out, 4))
	}
	return out, nil
}

// waitExit waits until p exits, stopping it (and erring) when ctx ends or timeout passes.
func waitExit(ctx context.Context, group *childproc.Group, p *childproc.Proc, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	defer group.Stop(p) // forgets an exited process; stops one still running
	select {
	case <-p.Exited():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return fmt.Errorf("still running after %v (stopped)", timeout)
	}
}

func readLog(p *childproc.Proc) string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// lastLines is the last n non-empty lines of s, joined by " / ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], " / ")
}

// apiClient is a client for the controller running now: its address and token are read on
// every call, so a restarted controller is found.
func (f *ferry) apiClient() (*api.Client, error) {
	info, err := f.home.ReadInfo()
	if err != nil {
		return nil, err
	}
	tok, err := os.ReadFile(f.home.TokenPath())
	if err != nil {
		return nil, err
	}
	return api.NewClient("http://"+info.Addr, strings.TrimSpace(string(tok))), nil
}

// status is the service as the controller reports it.
func (f *ferry) status(ctx context.Context) (api.ServiceStatus, error) {
	c, err := f.apiClient()
	if err != nil {
		return api.ServiceStatus{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := c.Services(ctx, serviceName)
	if err != nil {
		return api.ServiceStatus{}, err
	}
	if len(list) != 1 {
		return api.ServiceStatus{}, fmt.Errorf("status of %q: %d services in the answer", serviceName, len(list))
	}
	return list[0], nil
}

// endpointAddr is the host:port of a status endpoint URL.
func endpointAddr(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("service endpoint %q is not a URL", endpoint)
	}
	return u.Host, nil
}

// controllerPID is the pid of the controller running for this home: the one in
// controller.json, if that process is alive, not a zombie, and a ferry controller. 0 when none
// runs.
func (f *ferry) controllerPID() (int, error) {
	info, err := f.home.ReadInfo()
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !alive(info.PID) {
		return 0, nil
	}
	cmdline, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(info.PID), "cmdline"))
	if err != nil {
		return 0, nil // exited meanwhile
	}
	args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
	if len(args) < 2 || args[1] != "controller" {
		return 0, fmt.Errorf("controller.json names pid %d, which is not a ferry controller (%q)", info.PID, strings.Join(args, " "))
	}
	return info.PID, nil
}

// alive reports whether pid is a live, non-zombie process.
func alive(pid int) bool {
	s, err := procstat.ReadStat(procRoot, pid)
	return err == nil && s.State != 'Z'
}

// killController SIGKILLs the controller and waits until it is gone. It returns the pid.
func (f *ferry) killController(ctx context.Context) (int, error) {
	pid, err := f.controllerPID()
	if err != nil {
		return 0, err
	}
	if pid == 0 {
		return 0, errors.New("no controller is running to kill")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return pid, fmt.Errorf("kill -9 %d: %w", pid, err)
	}
	err = pollUntil(ctx, 5*time.Second, 20*time.Millisecond, func() (bool, error) { return !alive(pid), nil })
	if err != nil {
		return pid, fmt.Errorf("controller %d still alive after SIGKILL: %w", pid, err)
	}
	return pid, nil
}

// pollUntil calls cond every interval until it returns true or an error, ctx ends, or
// timeout passes.
func pollUntil(ctx context.Context, timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not so after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// openFDs counts the open file descriptors of pid.
func openFDs(pid int) (int, error) {
	entries, err := os.ReadDir(filepath.Join(procRoot, strconv.Itoa(pid), "fd"))
	return len(entries), err
}

// scrapeMetrics reads the Prometheus text exposition at addr and returns the samples whose
// names are wanted, keyed by name plus labels as written ("name{labels}").
func (f *ferry) scrapeMetrics(ctx context.Context, addr string, wanted ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := f.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics on %s: status %d", addr, resp.StatusCode)
	}
	return parseMetrics(resp.Body, wanted...)
}

// parseMetrics keeps the samples of the wanted metric names from a text exposition.
func parseMetrics(r io.Reader, wanted ...string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		key := line[:sp]
		name := key
		if i := strings.IndexByte(key, '{'); i >= 0 {
			name = key[:i]
		}
		for _, w := range wanted {
			if name == w {
				v, err := strconv.ParseFloat(line[sp+1:], 64)
				if err == nil {
					out[key] = v
				}
			}
		}
	}
	return out, sc.Err()
}

// processStats is a process's file descriptors and goroutines at one moment.
type processStats struct {
	PID        int `json:"pid"`
	FDs        int `json:"fds"`
	Goroutines int `json:"goroutines"`
}

// statsOf reads pid's open descriptors and, from its metrics listener at addr, its goroutines.
func (f *ferry) statsOf(ctx context.Context, pid int, metricsAddr string) (processStats, error) {
	st := processStats{PID: pid}
	var err error
	if st.FDs, err = openFDs(pid); err != nil {
		return st, fmt.Errorf("fds of %d: %w", pid, err)
	}
	m, err := f.scrapeMetrics(ctx, metricsAddr, "go_goroutines")
	if err != nil {
		return st, err
	}
	g, ok := m["go_goroutines"]
	if !ok {
		return st, fmt.Errorf("no go_goroutines in the metrics of %s", metricsAddr)
	}
	st.Goroutines = int(g)
	return st, nil
}

// ejectedOn reads a proxy's ferry_replicas_ejected and ferry_replica_ejections_total for the
// service from its metrics listener.
func (f *ferry) ejectedOn(ctx context.Context, metricsAddr string) (now, total float64, err error) {
	m, err := f.scrapeMetrics(ctx, metricsAddr, "ferry_replicas_ejected", "ferry_replica_ejections_total")
	if err != nil {
		return 0, 0, err
	}
	label := fmt.Sprintf("{service=%q}", serviceName)
	return m["ferry_replicas_ejected"+label], m["ferry_replica_ejections_total"+label], nil
}

// instance is the part of a local replica's instance.json the fault and leak checks use.
type instance struct {
	ID     string            `json:"id"`
	Labels map[string]string `json:"labels"`
	PID    int               `json:"pid"`
	PGID   int               `json:"pgid"`
}

// replicaID is the replica the instance was launched as (its ferry.replica-id label).
func (i instance) replicaID() int {
	v, _ := strconv.Atoi(i.Labels[launcher.LabelReplicaID])
	return v
}

// scanInstances records every instance the local launcher has a directory for now.
func (f *ferry) scanInstances() {
	paths, _ := filepath.Glob(filepath.Join(f.home.LocalDir(), "*", "instance.json"))
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // terminated meanwhile
		}
		var in instance
		if json.Unmarshal(b, &in) != nil || in.ID == "" || in.PGID <= 1 {
			continue // being written
		}
		f.seen[in.ID] = in
	}
}

// liveInstances is every seen instance whose process group still has a live process, by id.
func (f *ferry) liveInstances() []instance {
	f.scanInstances()
	f.mu.Lock()
	seen := make([]instance, 0, len(f.seen))
	for _, in := range f.seen {
		seen = append(seen, in)
	}
	f.mu.Unlock()
	var live []instance
	for _, in := range seen {
		if members, err := procstat.GroupStats(procRoot, in.PGID); err == nil && slicesAny(members, func(s procstat.Stat) bool { return s.State != 'Z' }) {
			live = append(live, in)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].replicaID() < live[j].replicaID() })
	return live
}

func slicesAny[T any](s []T, f func(T) bool) bool {
	for _, v := range s {
		if f(v) {
			return true
		}
	}
	return false
}

// instanceOf is the live instance of replica id.
func (f *ferry) instanceOf(id int) (instance, bool) {
	for _, in := range f.liveInstances() {
		if in.replicaID() == id {
			return in, true
		}
	}
	return instance{}, false
}

// signalGroup sends sig to a replica's process group, which this run's controller started.
func signalGroup(in instance, sig syscall.Signal) error {
	if in.PGID <= 1 {
		return fmt.Errorf("instance %s has no process group", in.ID)
	}
	return syscall.Kill(-in.PGID, sig)
}

// storeRow is one row of the store's replicas table.
type storeRow struct {
	ID     int    `json:"id"`
	Status string `json:"status"`
}

// storeRows reads, read-only, the service's rows: its replicas, and how many rows of it the
// services, versions and rollouts tables hold.
func (f *ferry) storeRows(ctx context.Context) (rows []storeRow, other map[string]int, err error) {
	db, err := sql.Open("sqlite", "file:"+f.home.StorePath()+"?mode=ro&_pragma=busy_timeout(2000)")
	if err != nil {
		return nil, nil, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	q, err := db.QueryContext(ctx, `SELECT id, status FROM replicas WHERE service = ? ORDER BY id`, serviceName)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", f.home.StorePath(), err)
	}
	for q.Next() {
		var r storeRow
		if err := q.Scan(&r.ID, &r.Status); err != nil {
			q.Close()
			return nil, nil, err
		}
		rows = append(rows, r)
	}
	q.Close()
	other = map[string]int{}
	for table, col := range map[string]string{"services": "name", "versions": "service", "rollouts": "service"} {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table+` WHERE `+col+` = ?`, serviceName).Scan(&n); err != nil {
			return rows, other, fmt.Errorf("read %s: %w", table, err)
		}
		other[table] = n
	}
	return rows, other, nil
}

// storeMismatches compares the store's replica rows with the controller's records: a row the
// controller does not report, a record the store lacks, or a status that differs.
func storeMismatches(rows []storeRow, recs []replicas.Record) []string {
	byID := map[int]string{}
	for _, r := range rows {
		byID[r.ID] = r.Status
	}
	var out []string
	for _, rec := range recs {
		st, ok := byID[rec.ID]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("replica %d (%s) has no row", rec.ID, rec.Status))
		case st != string(rec.Status):
			out = append(out, fmt.Sprintf("replica %d is %s in the store, %s in the controller", rec.ID, st, rec.Status))
		}
		delete(byID, rec.ID)
	}
	for id, st := range byID {
		out = append(out, fmt.Sprintf("row of replica %d (%s) that the controller does not report", id, st))
	}
	sort.Strings(out)
	return out
}

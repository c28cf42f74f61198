package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver, to read the controller's store

	"github.com/ferryserve/ferry/bench/childproc"
	"github.com/ferryserve/ferry/bench/procstat"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/replicas"
)

// servicekit.ProcRoot is where process state is read.

// ferry drives one FERRY_HOME (servicekit.Ferry), and reads as well the controller's metrics
// listener for goroutines and ejections, /proc for its file descriptors, and the SQLite
// store, read-only, for leftover rows.
type ferry struct {
	*servicekit.Ferry
	metricsAddr string // the controller's metrics listener
	gatewayAddr string // the controller's gateway, which fault 9 floods
	http        *http.Client
}

// newFerry drives homeDir with the controller's metrics on metricsAddr and, unlike the other
// drivers, its gateway on: gatewayAddr, a free loopback port.
func newFerry(bin, homeDir, metricsAddr, gatewayAddr string, group *childproc.Group) (*ferry, error) {
	f, err := servicekit.NewFerry(bin, homeDir, serviceName, metricsAddr, group)
	if err != nil {
		return nil, err
	}
	f.Env = append(f.Env, "FERRY_GATEWAY_ADDR="+gatewayAddr) // the last of a name wins
	return &ferry{Ferry: f, metricsAddr: metricsAddr, gatewayAddr: gatewayAddr, http: &http.Client{Timeout: 2 * time.Second}}, nil
}

// openFDs counts the open file descriptors of pid.
func openFDs(pid int) (int, error) {
	entries, err := os.ReadDir(filepath.Join(servicekit.ProcRoot, strconv.Itoa(pid), "fd"))
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

// instance is a local replica's instance, as the fault and leak checks see it.
type instance = servicekit.Instance

// replicaID is the replica the instance was launched as (its ferry.replica-id label).
func replicaID(in instance) int { return in.IntLabel(launcher.LabelReplicaID) }

// liveInstances is every seen instance whose process group still has a live, non-zombie
// process, by replica id.
func (f *ferry) liveInstances() []instance {
	var live []instance
	for _, in := range f.SeenInstances() {
		if slicesAny(servicekit.GroupMembers(in.PGID), func(s procstat.Stat) bool { return s.State != 'Z' }) {
			live = append(live, in)
		}
	}
	sort.Slice(live, func(i, j int) bool { return replicaID(live[i]) < replicaID(live[j]) })
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
		if replicaID(in) == id {
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
	db, err := sql.Open("sqlite", "file:"+f.Home.StorePath()+"?mode=ro&_pragma=busy_timeout(2000)")
	if err != nil {
		return nil, nil, err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	q, err := db.QueryContext(ctx, `SELECT id, status FROM replicas WHERE service = ? ORDER BY id`, serviceName)
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", f.Home.StorePath(), err)
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

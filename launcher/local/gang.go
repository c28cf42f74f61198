package local

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ferryserve/ferry/launcher"
)

// Jobs on local: every node of a gang gets a loopback address of its own (127.x.y.z; Linux
// routes all of 127.0.0.0/8 to lo), so ranks rendezvous over TCP on their own addresses and
// fixed ports, as they would across machines, and two gangs using torchrun's default port do
// not collide. Addresses are fixed before launch (PrepareGang), so each node finds its peers in
// SKYPILOT_NODE_IPS from the start.

var _ launcher.GangPreparer = (*Provider)(nil)

// PrepareGang gives each node of a job's gang an unused loopback address.
func (p *Provider) PrepareGang(spec launcher.Spec, n int) (launcher.Spec, error) {
	if err := p.checkGang(spec, n); err != nil {
		return spec, err
	}
	if spec.Job == nil {
		return spec, nil
	}
	used, err := p.hostsInUse()
	if err != nil {
		return spec, err
	}
	ips := make([]string, 0, n)
	for tries := 0; len(ips) < n; tries++ {
		if tries > 100*n {
			return spec, fmt.Errorf("%w: no free loopback address for a %d-node gang", launcher.ErrNoCapacity, n)
		}
		ip, err := randomLoopback()
		if err != nil {
			return spec, err
		}
		if used[ip] || !bindable(ip) {
			continue
		}
		used[ip] = true
		ips = append(ips, ip)
	}
	job := *spec.Job
	job.NodeIPs = ips
	spec.Job = &job
	return spec, nil
}

// nodeHost is the address a launched instance binds: its gang rank's own address for a job's
// node, Options.Host otherwise.
func (p *Provider) nodeHost(spec launcher.Spec) (string, error) {
	if spec.Job == nil || len(spec.Job.NodeIPs) == 0 {
		return p.opts.Host, nil
	}
	rank := 0
	if r, ok := spec.Labels[launcher.LabelNodeRank]; ok {
		var err error
		if rank, err = strconv.Atoi(r); err != nil {
			return "", fmt.Errorf("%w: node rank %q", launcher.ErrInvalid, r)
		}
	}
	if rank < 0 || rank >= len(spec.Job.NodeIPs) {
		return "", fmt.Errorf("%w: node rank %d of a %d-address gang", launcher.ErrInvalid, rank, len(spec.Job.NodeIPs))
	}
	ip := net.ParseIP(spec.Job.NodeIPs[rank])
	if ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("%w: local nodes bind loopback addresses, not %q", launcher.ErrInvalid, spec.Job.NodeIPs[rank])
	}
	return ip.String(), nil
}

// hostsInUse are the addresses of live instances (job nodes, fixed-port replicas) and of those
// being launched.
func (p *Provider) hostsInUse() (map[string]bool, error) {
	entries, err := os.ReadDir(p.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("list local instances: %w", err)
	}
	used := map[string]bool{p.opts.Host: true}
	p.recentlyHanded(used)
	for _, e := range entries {
		if meta, err := loadMetadata(filepath.Join(p.opts.Dir, e.Name())); err == nil && meta.Host != "" {
			used[meta.Host] = true
		}
	}
	return used, nil
}

// randomLoopback is a random address in 127.1.0.1–127.254.255.254: away from 127.0.0.x, where
// replicas and other programs live.
func randomLoopback() (string, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	a := 1 + int(b[0])%254
	last := 1 + int(b[2])%254
	return fmt.Sprintf("127.%d.%d.%d", a, b[1], last), nil
}

// bindable reports whether this machine lets a program listen on ip (not every OS routes all
// of 127/8 to the loopback interface).
func bindable(ip string) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

// exitCode is how a job node's program ended: as recorded by the controller that waited for
// it, else as its wrapper wrote it (an earlier controller started it). nil when it was killed
// by a signal or is no job's node.
func (p *Provider) exitCode(meta *metadata) *int {
	if meta.ExitCode != nil {
		return meta.ExitCode
	}
	if !meta.Job {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(p.opts.Dir, meta.ID, exitStatusFile))
	if err != nil {
		return nil
	}
	c, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || c < 0 {
		return nil
	}
	return &c
}

var _ launcher.JobCleaner = (*Provider)(nil)

// checkpointDir is where a job's node keeps what survives recovery: one directory per claim
// under CheckpointRoot, which every node of the gang shares (they run on this machine). A
// container's mount path (JobSpec.CheckpointDir) means nothing here.
func (p *Provider) checkpointDir(spec launcher.Spec) string {
	if spec.Job == nil || spec.Job.CheckpointClaim == "" || !validClaim(spec.Job.CheckpointClaim) {
		return ""
	}
	return filepath.Join(p.opts.CheckpointRoot, spec.Job.CheckpointClaim)
}

// CleanupJob removes the job's checkpoint directory (claim launcher.CheckpointClaim(job)).
func (p *Provider) CleanupJob(_ context.Context, job string) error {
	claim := launcher.CheckpointClaim(job)
	if !validClaim(claim) {
		return fmt.Errorf("%w: job %q", launcher.ErrInvalid, job)
	}
	return os.RemoveAll(filepath.Join(p.opts.CheckpointRoot, claim))
}

// validClaim keeps a claim a single path element.
func validClaim(c string) bool {
	return c != "" && c != "." && c != ".." && !strings.ContainsAny(c, `/\`+"\x00")
}

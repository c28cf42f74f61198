// Package trainsim is a stand-in for a distributed training program, for Ferry's job examples,
// tests and demos where no GPU and no PyTorch are: its nodes rendezvous over TCP the way
// torchrun's do (rank 0 listens on --master-addr:--master-port, every other rank connects),
// run an all-reduce per step, and rank 0 checkpoints to a directory and resumes from it, also
// on SIGTERM, as a preemptible training job must.
package trainsim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Config is one node's part of a run.
type Config struct {
	NNodes, NodeRank int
	MasterAddr       string
	MasterPort       int
	Steps            int
	StepTime         time.Duration
	// CheckpointDir, when set, is where rank 0 keeps checkpoint.json every CheckpointEvery
	// steps and on SIGTERM, and where a run resumes from.
	CheckpointDir   string
	CheckpointEvery int
	// RendezvousTimeout bounds waiting for the other ranks.
	RendezvousTimeout time.Duration
	Out               io.Writer
}

// Checkpoint is what rank 0 saves.
type Checkpoint struct {
	Step int   `json:"step"`
	Sum  int64 `json:"sum"`
}

// ErrPeerLost means a rank went away mid-run: the job's gang is broken.
var ErrPeerLost = errors.New("a peer left the rendezvous")

// Run runs this node until the last step, ctx ends (SIGTERM: rank 0 checkpoints first) or a
// peer is lost.
func Run(ctx context.Context, cfg Config) error {
	if cfg.NNodes < 1 || cfg.NodeRank < 0 || cfg.NodeRank >= cfg.NNodes {
		return fmt.Errorf("rank %d of %d nodes", cfg.NodeRank, cfg.NNodes)
	}
	if cfg.CheckpointEvery <= 0 {
		cfg.CheckpointEvery = 10
	}
	if cfg.RendezvousTimeout <= 0 {
		cfg.RendezvousTimeout = 2 * time.Minute
	}
	addr := net.JoinHostPort(cfg.MasterAddr, strconv.Itoa(cfg.MasterPort))
	if cfg.NodeRank == 0 {
		return runMaster(ctx, cfg, addr)
	}
	return runWorker(ctx, cfg, addr)
}

// peer is one connection between rank 0 and a worker; lines of JSON each way.
type peer struct {
	conn net.Conn
	r    *bufio.Scanner
	w    *json.Encoder
}

func newPeer(c net.Conn) *peer {
	return &peer{conn: c, r: bufio.NewScanner(c), w: json.NewEncoder(c)}
}

func (p *peer) recv(v any) error {
	if !p.r.Scan() {
		if err := p.r.Err(); err != nil {
			return fmt.Errorf("%w: %v", ErrPeerLost, err)
		}
		return ErrPeerLost
	}
	return json.Unmarshal(p.r.Bytes(), v)
}

type msg struct {
	Rank  int   `json:"rank,omitempty"`
	Step  int   `json:"step"`
	Value int64 `json:"value"`
	Done  bool  `json:"done,omitempty"`
}

func runMaster(ctx context.Context, cfg Config, addr string) error {
	ck := load(cfg.CheckpointDir)
	if ck.Step > 0 {
		fmt.Fprintf(cfg.Out, "rank 0: resuming from checkpoint at step %d\n", ck.Step)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("rank 0 listen on %s: %w", addr, err)
	}
	defer l.Close()
	fmt.Fprintf(cfg.Out, "rank 0: waiting for %d peer(s) on %s\n", cfg.NNodes-1, addr)
	peers := make([]*peer, 0, cfg.NNodes-1)
	deadline := time.Now().Add(cfg.RendezvousTimeout)
	for len(peers) < cfg.NNodes-1 {
		_ = l.(*net.TCPListener).SetDeadline(deadline)
		c, err := l.Accept()
		if err != nil {
			return fmt.Errorf("rendezvous: %d of %d peers joined: %w", len(peers), cfg.NNodes-1, err)
		}
		p := newPeer(c)
		var hello msg
		if err := p.recv(&hello); err != nil {
			c.Close()
			continue
		}
		fmt.Fprintf(cfg.Out, "rank 0: rank %d joined from %s\n", hello.Rank, c.RemoteAddr())
		peers = append(peers, p)
	}
	defer func() {
		for _, p := range peers {
			p.conn.Close()
		}
	}()
	for _, p := range peers {
		if err := p.w.Encode(msg{Step: ck.Step}); err != nil {
			return fmt.Errorf("%w: %v", ErrPeerLost, err)
		}
	}
	for step := ck.Step + 1; step <= cfg.Steps; step++ {
		select {
		case <-ctx.Done():
			save(cfg, ck)
			fmt.Fprintf(cfg.Out, "rank 0: stopped at step %d; checkpoint saved\n", ck.Step)
			return ctx.Err()
		case <-time.After(cfg.StepTime):
		}
		sum := int64(step) // rank 0's own share
		for _, p := range peers {
			var m msg
			if err := p.recv(&m); err != nil {
				return err
			}
			sum += m.Value
		}
		for _, p := range peers {
			if err := p.w.Encode(msg{Step: step, Value: sum, Done: step == cfg.Steps}); err != nil {
				return fmt.Errorf("%w: %v", ErrPeerLost, err)
			}
		}
		ck = Checkpoint{Step: step, Sum: ck.Sum + sum}
		if step%cfg.CheckpointEvery == 0 || step == cfg.Steps {
			save(cfg, ck)
			fmt.Fprintf(cfg.Out, "rank 0: step %d/%d all-reduced %d; checkpoint saved\n", step, cfg.Steps, sum)
		}
	}
	fmt.Fprintf(cfg.Out, "training done: %d steps on %d node(s), total %d\n", cfg.Steps, cfg.NNodes, ck.Sum)
	return nil
}

func runWorker(ctx context.Context, cfg Config, addr string) error {
	var c net.Conn
	deadline := time.Now().Add(cfg.RendezvousTimeout)
	for {
		var err error
		c, err = (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("rank %d: rendezvous with %s: %w", cfg.NodeRank, addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer c.Close()
	go func() { <-ctx.Done(); c.Close() }()
	p := newPeer(c)
	if err := p.w.Encode(msg{Rank: cfg.NodeRank}); err != nil {
		return fmt.Errorf("%w: %v", ErrPeerLost, err)
	}
	var start msg
	if err := p.recv(&start); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "rank %d: joined %s, starting after step %d\n", cfg.NodeRank, addr, start.Step)
	for step := start.Step + 1; step <= cfg.Steps; step++ {
		if err := p.w.Encode(msg{Step: step, Value: int64(step * (cfg.NodeRank + 1))}); err != nil {
			return fmt.Errorf("%w: %v", ErrPeerLost, err)
		}
		var m msg
		if err := p.recv(&m); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		if m.Done {
			break
		}
	}
	fmt.Fprintf(cfg.Out, "rank %d: done\n", cfg.NodeRank)
	return nil
}

func load(dir string) Checkpoint {
	var ck Checkpoint
	if dir == "" {
		return ck
	}
	if b, err := os.ReadFile(filepath.Join(dir, "checkpoint.json")); err == nil {
		_ = json.Unmarshal(b, &ck)
	}
	return ck
}

// save writes the checkpoint atomically: a node killed mid-write leaves the previous one.
func save(cfg Config, ck Checkpoint) {
	if cfg.CheckpointDir == "" {
		return
	}
	b, _ := json.Marshal(ck)
	tmp := filepath.Join(cfg.CheckpointDir, "checkpoint.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		fmt.Fprintf(cfg.Out, "rank 0: checkpoint: %v\n", err)
		return
	}
	if err := os.Rename(tmp, filepath.Join(cfg.CheckpointDir, "checkpoint.json")); err != nil {
		fmt.Fprintf(cfg.Out, "rank 0: checkpoint: %v\n", err)
	}
}

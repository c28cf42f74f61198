// Package leader elects one controller among several through a coordination.k8s.io Lease
// (client-go's leader election) and hands out the fencing term every store write carries.
//
// Timing. A leader killed with SIGKILL never releases its Lease, so a follower can take over
// only once the Lease has gone LeaseDuration without a change it observed. Followers read the
// Lease every RetryPeriod (times client-go's jitter, 1.2), so after the leader's death a
// follower takes over within about RetryPeriod·1.2 (to observe its last renewal) +
// LeaseDuration + RetryPeriod·1.2 (to notice the expiry): with the defaults, 8 s + 2 × 1.2 s
// ≈ 10.4 s, inside the 15 s Ferry promises, leaving time to load state and adopt. The leader
// renews every RetryPeriod and gives up after RenewDeadline (6 s) without a successful renewal,
// 2 s before any follower may act, which absorbs clock-rate differences between machines. The
// cost is one Lease write a second by the leader and one read a second per follower.
//
// Term. The term is the Lease's leaseTransitions as written when this process acquired it; the
// API server's admission policy rejects a write stamped with any other term, so a deposed
// leader that has not noticed yet cannot write. Term also reports !ok locally from the moment
// the renew deadline has passed since the last successful renewal, before client-go gives up.
package leader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Defaults of Config's durations; see the package comment for why these.
const (
	DefaultLeaseDuration = 8 * time.Second
	DefaultRenewDeadline = 6 * time.Second
	DefaultRetryPeriod   = 1 * time.Second
	// DefaultLeaseName is --lease-name's default.
	DefaultLeaseName = "ferry-controller"
)

// ErrLost is what Run returns when this process led and stopped leading: the controller exits
// on it (client-go's advice: leader-only state is not worth unwinding in place; a restarted
// process comes back as a follower).
var ErrLost = errors.New("leadership lost")

// Config configures an Elector.
type Config struct {
	// Client reaches the API server's coordination.k8s.io/v1 Leases.
	Client coordinationclient.LeasesGetter
	// Namespace and Name locate the Lease.
	Namespace, Name string
	// Identity is this process's holderIdentity; DefaultIdentity if empty.
	Identity string
	// URL is this process's API URL, written on the Lease while it leads (AnnotationURL).
	URL string
	// LeaseDuration, RenewDeadline and RetryPeriod are client-go's; zero takes the defaults.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *zap.Logger
}

// Callbacks are called as leadership changes. OnStartedLeading runs in its own goroutine with a
// context that ends when leadership does; OnStoppedLeading runs when Run is about to return
// after having led.
type Callbacks struct {
	OnStartedLeading func(ctx context.Context)
	OnStoppedLeading func()
}

// DefaultIdentity is the hostname and the process id: unique per process, and a pod's name in
// Kubernetes.
func DefaultIdentity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "ferry"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// Elector is one candidate. Term is safe for concurrent use.
type Elector struct {
	cfg  Config
	lock *leaseLock
	log  *zap.Logger

	mu sync.Mutex
	// leading is set by this identity's first Lease write (the acquisition) and cleared for
	// good when client-go stops leading (done).
	leading, led, done bool
	// term and renewed are from this identity's last successful Lease write.
	term    int64
	renewed time.Time

	// cache of Leader's answer, read at most once per RetryPeriod.
	seenAt         time.Time
	seenID, seenTo string
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Elector, error) {
	if cfg.Client == nil || cfg.Namespace == "" || cfg.Name == "" {
		return nil, errors.New("leader election needs a Kubernetes client, a namespace and a lease name")
	}
	if cfg.Identity == "" {
		cfg.Identity = DefaultIdentity()
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewDeadline == 0 {
		cfg.RenewDeadline = DefaultRenewDeadline
	}
	if cfg.RetryPeriod == 0 {
		cfg.RetryPeriod = DefaultRetryPeriod
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	e := &Elector{cfg: cfg, log: cfg.Logger}
	e.lock = &leaseLock{client: cfg.Client, namespace: cfg.Namespace, name: cfg.Name, identity: cfg.Identity, url: cfg.URL,
		onWrite: e.wrote}
	return e, nil
}

// Identity is this candidate's holderIdentity.
func (e *Elector) Identity() string { return e.cfg.Identity }

// wrote records a successful Lease write; only this identity's count as renewals.
func (e *Elector) wrote(started time.Time, rec rl.LeaderElectionRecord) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rec.HolderIdentity != e.cfg.Identity {
		e.leading = false // the release on the way out
		return
	}
	if e.done {
		return
	}
	e.leading, e.led = true, true
	e.term, e.renewed = int64(rec.LeaderTransitions), started
}

// Term is the fencing term and holder this process writes with, ok only while it leads and its
// last renewal is younger than RenewDeadline: past that, another process may be about to take
// over, so writes must stop before client-go even notices.
func (e *Elector) Term() (term int64, holder string, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ok = e.leading && time.Since(e.renewed) < e.cfg.RenewDeadline
	return e.term, e.cfg.Identity, ok
}

// Run campaigns until ctx ends, calling cb as leadership comes and goes. It returns ctx's error
// if this process never led or led until ctx ended, and ErrLost if it stopped leading first.
func (e *Elector) Run(ctx context.Context, cb Callbacks) error {
	lost := false
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          e.lock,
		LeaseDuration: e.cfg.LeaseDuration,
		RenewDeadline: e.cfg.RenewDeadline,
		RetryPeriod:   e.cfg.RetryPeriod,
		Name:          e.cfg.Name,
		// A leader that stops cleanly hands over at once rather than after LeaseDuration; the
		// term moves, so writes it still has in flight are refused.
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				term, holder, _ := e.Term()
				e.log.Info("leading", zap.String("lease", e.lock.Describe()), zap.String("identity", holder), zap.Int64("term", term))
				if cb.OnStartedLeading != nil {
					cb.OnStartedLeading(lctx)
				}
			},
			OnStoppedLeading: func() {
				e.mu.Lock()
				was := e.led
				e.leading, e.done = false, true
				e.mu.Unlock()
				if !was {
					return // client-go calls it on exit even when it never led
				}
				lost = ctx.Err() == nil
				e.log.Warn("stopped leading", zap.String("lease", e.lock.Describe()), zap.Bool("lost", lost))
				if cb.OnStoppedLeading != nil {
					cb.OnStoppedLeading()
				}
			},
			OnNewLeader: func(id string) {
				if id != e.cfg.Identity {
					e.log.Info("following", zap.String("leader", id))
				}
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	if lost {
		return ErrLost
	}
	return ctx.Err()
}

// Leader is the Lease's current holder and the URL it wrote, read from the API server at most
// once per RetryPeriod; empty when the Lease is missing or expired as the API server's clock
// sees it. A follower names it in X-Ferry-Leader and forwards the API there.
func (e *Elector) Leader(ctx context.Context) (identity, url string, err error) {
	e.mu.Lock()
	if time.Since(e.seenAt) < e.cfg.RetryPeriod {
		defer e.mu.Unlock()
		return e.seenID, e.seenTo, nil
	}
	e.mu.Unlock()
	lease, err := e.cfg.Client.Leases(e.cfg.Namespace).Get(ctx, e.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h != "" {
		identity, url = *h, lease.Annotations[AnnotationURL]
		if r, d := lease.Spec.RenewTime, lease.Spec.LeaseDurationSeconds; r != nil && d != nil &&
			time.Since(r.Time) > time.Duration(*d)*time.Second+e.cfg.LeaseDuration {
			identity, url = "", "" // long expired: nobody leads (a fresh follower waits a full lease anyway)
		}
	}
	e.mu.Lock()
	e.seenAt, e.seenID, e.seenTo = time.Now(), identity, url
	e.mu.Unlock()
	return identity, url, nil
}

// Run is New and Elector.Run in one, for a caller that needs no Term.
func Run(ctx context.Context, cfg Config, cb Callbacks) error {
	e, err := New(cfg)
	if err != nil {
		return err
	}
	return e.Run(ctx, cb)
}

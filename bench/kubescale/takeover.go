package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/ferryserve/ferry/bench/benchkit"
	"github.com/ferryserve/ferry/bench/servicekit"
	"github.com/ferryserve/ferry/internal/api"
)

// takeover kills the leader under a request loop through attached proxies and measures how long
// the follower takes to lead and to have published every service, whether any pod was launched
// again, and how many requests failed.
func (s *scenario) takeover(ctx context.Context) error {
	clients, err := s.startProxies(ctx)
	if err != nil {
		return err
	}
	before, err := s.e.pods(ctx)
	if err != nil {
		return err
	}
	load := startLoad(clients, s.opts.maxRequests)
	defer load.stop()
	if err := servicekit.PollUntil(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) { return load.ok.Load() >= 20, nil }); err != nil {
		return fmt.Errorf("no requests flowing through the proxies: %d ok, %d failed (%v)", load.ok.Load(), load.failed.Load(), load.firstErr())
	}
	s.progress("kill -9 %s (the leader) under a request loop through %d attached proxies", s.e.ctls[0].id, len(clients))
	killed, err := killLeader(s.e.ctls[0])
	if err != nil {
		return err
	}
	follower := s.e.ctls[1]
	rss := sampleRSS(follower.proc.PID, 500*time.Millisecond)
	defer func() { s.rep.NewLeaderRSS = rss.stop() }()
	var acquired time.Time
	err = servicekit.PollUntil(ctx, time.Minute, 20*time.Millisecond, func() (bool, error) {
		lease, err := s.e.lease(ctx)
		if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != follower.id {
			return false, nil
		}
		acquired = time.Now()
		if at := lease.Spec.AcquireTime; at != nil && at.After(killed) {
			acquired = at.Time // its own clock, on this machine
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s never took the Lease: %w", follower.id, err)
	}
	s.rep.LeaseTakenSeconds = acquired.Sub(killed).Seconds()
	s.progress("  %s took the Lease %.2fs after the kill", follower.id, s.rep.LeaseTakenSeconds)
	s.waitPublished(ctx, follower, acquired)
	atPublished := load.ok.Load()
	_ = servicekit.SleepCtx(ctx, s.opts.loadFor)
	load.stop()
	s.rep.Requests, s.rep.FailedRequests = load.ok.Load(), load.failed.Load()
	s.rep.RequestsAfterTakeover = s.rep.Requests - atPublished
	if err := load.firstErr(); err != nil {
		s.rep.FirstFailure = err.Error()
	}
	// The new leader's passes: adoption and steady state, no launch.
	if h, err := scrapeHistogram(ctx, follower.metricsURL, "ferry_reconcile_duration_seconds", "loop", "replicas"); err == nil {
		s.rep.NewLeaderReconcileP99, s.rep.NewLeaderReconcilePasses = h.quantile(0.99), h.count
	}
	after, err := s.e.pods(ctx)
	if err != nil {
		return err
	}
	s.rep.PodsCompared = len(before)
	s.rep.PodsRelaunched = relaunched(before, after)
	s.progress("  %d requests, %d failed; %d of %d pods launched again", s.rep.Requests, s.rep.FailedRequests, len(s.rep.PodsRelaunched), len(before))
	return nil
}

// waitPublished polls the new leader until it has published every service: each is listed
// with the replicas the first leader had (adopted, none launched) and serves (one READY or
// more). A replica whose probe misses under load is NOT_READY for a while, so every replica
// READY again is timed apart, as far as the bound.
func (s *scenario) waitPublished(ctx context.Context, follower *controller, acquired time.Time) {
	s.rep.PublishedSeconds, s.rep.AllReadyAgainSeconds = -1, -1
	var last string
	err := servicekit.PollUntil(ctx, 2*time.Minute, 100*time.Millisecond, func() (bool, error) {
		list, err := follower.f.Services(ctx, statusTimeout)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ready, readyServices := countReady(list, s.opts.replicas)
		if s.rep.PublishedSeconds < 0 {
			if missing := unpublished(list, s.adopted); missing != "" {
				last = missing
				return false, nil
			}
			s.rep.PublishedSeconds = time.Since(acquired).Seconds()
			s.progress("  %s has published all %d services with the replicas it adopted %.2fs after taking the Lease", follower.id, s.opts.services, s.rep.PublishedSeconds)
		}
		last = fmt.Sprintf("%d replicas READY, %d services with all READY", ready, readyServices)
		return readyServices == s.opts.services, nil
	})
	if err != nil {
		s.rep.Notes = append(s.rep.Notes, fmt.Sprintf("after the takeover, within 2 min: %s (%v)", last, err))
		return
	}
	s.rep.AllReadyAgainSeconds = time.Since(acquired).Seconds()
	s.progress("  every replica READY under %s %.2fs after it took the Lease", follower.id, s.rep.AllReadyAgainSeconds)
}

// unpublished says which service the new leader does not serve with the replicas adopted from
// the first leader, "" when it serves every one.
func unpublished(list []api.ServiceStatus, adopted map[string]string) string {
	have := instances(list)
	for name, ids := range adopted {
		if have[name] != ids {
			return fmt.Sprintf("service %s: replicas [%s], want [%s]", name, have[name], ids)
		}
	}
	for _, st := range list {
		if st.ReadyReplicas == 0 {
			return fmt.Sprintf("service %s: no READY replica", st.Name)
		}
	}
	return ""
}

// relaunched names the pods of before that are gone or were replaced (same name, new UID), and
// any pod that is new.
func relaunched(before, after map[string]string) []string {
	var out []string
	for name, uid := range before {
		if after[name] != uid {
			out = append(out, name)
		}
	}
	for name := range after {
		if _, ok := before[name]; !ok {
			out = append(out, name+" (new)")
		}
	}
	return out
}

// startProxies starts one attached proxy per load service, given both controllers' URLs, and
// waits until each answers a completion.
func (s *scenario) startProxies(ctx context.Context) ([]*servicekit.ChatClient, error) {
	controllers := s.e.ctls[0].url + "," + s.e.ctls[1].url
	var clients []*servicekit.ChatClient
	for i := range s.opts.loadServices {
		name := serviceName(i)
		addr, err := benchkit.FreeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		if _, err := s.e.proxyHome.Start("proxy-"+name, "proxy", "--attach", name, "--controller", controllers, "--listen", addr); err != nil {
			return nil, err
		}
		client, err := servicekit.NewChatClient(addr, 4, 30*time.Second, "How many replicas are enough?", 8, 8)
		if err != nil {
			return nil, err
		}
		err = servicekit.PollUntil(ctx, time.Minute, 100*time.Millisecond, func() (bool, error) { return complete(client) == nil, nil })
		if err != nil {
			return nil, fmt.Errorf("attached proxy for %s at %s never answered: %v", name, addr, complete(client))
		}
		clients = append(clients, client)
	}
	return clients, nil
}

// complete sends one completion; anything but a 200 with a body is an error.
func complete(c *servicekit.ChatClient) error {
	return c.Plain(func(resp *fasthttp.Response) error {
		if resp.StatusCode() != fasthttp.StatusOK || len(resp.Body()) == 0 {
			return fmt.Errorf("HTTP %d: %.200s", resp.StatusCode(), resp.Body())
		}
		return nil
	})
}

// loadMaxTime bounds the request loop in time whatever happens to the driver meanwhile.
const loadMaxTime = 10 * time.Minute

// load is a closed loop of requests, two workers per proxy, bounded in count and time, until
// stopped.
type load struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	first      error
	stop       func()
}

func (l *load) firstErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

func startLoad(clients []*servicekit.ChatClient, maxRequests int) *load {
	l := &load{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	perWorker := max(1, maxRequests/(2*len(clients)))
	deadline := time.Now().Add(loadMaxTime)
	for _, c := range clients {
		for range 2 {
			wg.Go(func() {
				for range perWorker {
					select {
					case <-done:
						return
					default:
					}
					if time.Now().After(deadline) {
						return
					}
					if err := complete(c); err != nil {
						l.failed.Add(1)
						l.mu.Lock()
						if l.first == nil {
							l.first = err
						}
						l.mu.Unlock()
						continue
					}
					l.ok.Add(1)
				}
			})
		}
	}
	l.stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	return l
}

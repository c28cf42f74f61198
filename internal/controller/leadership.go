package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/ferryserve/ferry/internal/api"
	"github.com/ferryserve/ferry/internal/leader"
	"github.com/ferryserve/ferry/proxy/attach"
)

// High availability. With Options.Elector several controllers share one store (the Kubernetes
// one) and one Lease. Each starts as a follower: it serves its API, but runs no service, scale
// loop or job, and launches nothing. Its API forwards to the leader (the URL the leader wrote
// on the Lease), except its own status, stop and logs; attached proxies' feed is answered 503
// with X-Ferry-Leader, so that a proxy talks to the leader directly (proxy/attach).
//
// On winning the Lease the controller does what a restarted controller does (lead): it loads
// every service from the store, and the replica managers and the jobs manager adopt what is in
// flight (running replicas, strays, a rollout half-way, jobs in any saved state), then start
// their loops. Every store write carries the term (leader.Elector.Term), so a deposed leader
// cannot write, and a launch is always preceded by the write of its record.
//
// On losing the Lease the controller exits (Start returns leader.ErrLost): the loops, managers
// and in-flight launches are not built to be demoted in place, client-go advises exiting, and
// the process manager (a Deployment) brings it back as a follower. Fencing covers the moments
// before it is gone.

// HeaderLeader names the leader's API URL in a follower's 503 answers.
const HeaderLeader = "X-Ferry-Leader"

// headerForwarded marks a request a follower forwarded, so that it is never forwarded twice
// (two followers that each think the other leads).
const headerForwarded = "X-Ferry-Forwarded-By"

// campaign runs the election until ctx ends and returns the API handler: the follower's until
// this controller leads, the leader's from then on. A failed lead or lost leadership goes to
// leaderErr, which ends Start.
func (c *Controller) campaign(ctx context.Context, tokens api.Tokens) http.Handler {
	e := c.opts.Elector
	c.spawn(&c.wg, "leader election", func() {
		err := e.Run(ctx, leader.Callbacks{OnStartedLeading: func(lctx context.Context) {
			c.leadWG.Add(1)
			defer c.leadWG.Done()
			c.becomeLeader(ctx, tokens)
		}})
		if errors.Is(err, leader.ErrLost) {
			c.fail(err)
		}
	})
	follower := api.NewHandler(c, tokens, c.log.Named("api"))
	fwd := c.forwarder()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := c.api.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
		if followerLocal(r) {
			follower.ServeHTTP(w, r)
			return
		}
		c.toLeader(w, r, fwd)
	})
}

// becomeLeader leads with Start's context: the loops it starts end with the controller, and
// a lost Lease ends the controller.
func (c *Controller) becomeLeader(ctx context.Context, tokens api.Tokens) {
	term, holder, _ := c.opts.Elector.Term()
	c.log.Info("elected: loading state and adopting what is in flight", zap.Int64("term", term), zap.String("identity", holder))
	if err := c.lead(ctx); err != nil {
		c.fail(fmt.Errorf("start leading: %w", err))
		return
	}
	h := c.leaderHandler(tokens)
	c.api.Store(&h)
	close(c.leading)
	c.log.Info("leading", zap.Int("services", len(c.serviceList())))
}

// fail ends Start with err (the first of several).
func (c *Controller) fail(err error) {
	select {
	case c.leaderErr <- err:
	default:
	}
}

// followerLocal reports whether a follower answers r itself: its own status, stop and logs.
func followerLocal(r *http.Request) bool {
	return r.URL.Path == "/v1/controller" || r.URL.Path == "/v1/controller/stop" || r.URL.Path == "/v1/controller/logs"
}

// attachFeed reports whether r is an attached proxy's (replica set, load report or the list
// of services an attached gateway fronts): answered
// 503, not forwarded, so that the proxy finds the leader itself and a follower's death does not
// cut its long poll.
func attachFeed(r *http.Request) bool {
	return strings.HasSuffix(r.URL.Path, "/replicaset") || strings.HasSuffix(r.URL.Path, "/proxyload") || r.URL.Path == attach.ServiceListPath
}

// electedWait bounds how long a request waits for this controller, just elected, to load
// its state and adopt what is in flight (usually a fraction of a second).
const electedWait = 30 * time.Second

// toLeader forwards r to the leader, or answers 503 naming it when it cannot. While this
// controller holds the Lease but is still loading, r waits for it to lead.
func (c *Controller) toLeader(w http.ResponseWriter, r *http.Request, fwd *httputil.ReverseProxy) {
	e := c.opts.Elector
	if _, _, ok := e.Term(); ok {
		select {
		case <-c.leading:
			(*c.api.Load()).ServeHTTP(w, r)
			return
		case <-r.Context().Done():
			return
		case <-time.After(electedWait):
		}
	}
	id, to, err := e.Leader(r.Context())
	if err != nil {
		c.log.Warn("read the lease", zap.Error(err))
	}
	if to != "" {
		w.Header().Set(HeaderLeader, to)
	}
	target, perr := url.Parse(to)
	if id == "" || to == "" || perr != nil || id == e.Identity() || attachFeed(r) || r.Header.Get(headerForwarded) != "" {
		msg := "this controller is a follower and no leader is known yet; retry shortly"
		if to != "" {
			msg = "this controller is a follower; the leader is " + to
		}
		var body api.ErrorBody
		body.Error.Code, body.Error.Message = "not_leader", msg
		w.Header().Set("Retry-After", "1")
		api.WriteJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	r.Header.Set(headerForwarded, e.Identity())
	fwd.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), leaderURLKey{}, target)))
}

type leaderURLKey struct{}

// forwarder proxies a request to the leader URL in its context, streaming (logs, long polls)
// as it comes. Off loopback the leader serves HTTPS with the certificate every controller
// shares (--api-tls-cert): the leader must present exactly that one, whatever address it is
// reached at (a pod IP is in no certificate), as attached proxies pin it (api.ClientFor).
func (c *Controller) forwarder() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(leaderURLKey{}).(*url.URL))
		},
		Transport:     c.leaderRoundTripper(),
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			var body api.ErrorBody
			status := http.StatusBadGateway
			body.Error.Code, body.Error.Message = "leader_unreachable", "forward to the leader: "+err.Error()
			if errors.Is(err, errLeaderInClear) {
				status, body.Error.Code, body.Error.Message = http.StatusServiceUnavailable, "leader_not_tls", err.Error()
				c.log.Warn("not forwarding to the leader", zap.Error(err))
			}
			w.Header().Set("Retry-After", "1")
			api.WriteJSON(w, status, body)
		},
	}
}

// leaderRoundTripper reaches the leader: over HTTPS, the leader's certificate pinned to this
// controller's own, or plain HTTP on loopback (leaderTransport).
func (c *Controller) leaderRoundTripper() http.RoundTripper {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if pinned := c.ownCertificate(); pinned != nil {
		tr.TLSClientConfig = &tls.Config{
			MinVersion:         tls.VersionTLS12,
			InsecureSkipVerify: true, // replaced by the stricter comparison below
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) > 0 && bytes.Equal(cs.PeerCertificates[0].Raw, pinned) {
					return nil
				}
				return errors.New("the leader presented a certificate other than --api-tls-cert")
			},
		}
	}
	return leaderTransport{tr}
}

// errLeaderInClear refuses to forward a request, and the controller token it carries, to a
// leader whose URL would send it in clear text over a network: whoever can write the Lease, or
// watch the network, would get the token.
var errLeaderInClear = errors.New("refusing to send the controller token in clear text")

// leaderTransport forwards to the leader only over HTTPS, or plain HTTP on loopback (two
// controllers on one machine). Checking each request at the transport holds for every way a
// request reaches the leader.
type leaderTransport struct{ http.RoundTripper }

var _ http.RoundTripper = leaderTransport{}

func (t leaderTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := leaderURLSafe(r.URL); err != nil {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, err
	}
	return t.RoundTripper.RoundTrip(r)
}

// leaderURLSafe accepts https, and http to a loopback address (an IP literal or localhost).
func leaderURLSafe(u *url.URL) error {
	switch {
	case u.Scheme == "https":
		return nil
	case u.Scheme == "http" && isLoopbackHost(u.Hostname()):
		return nil
	}
	return fmt.Errorf("%w: the leader's API URL %s on the Lease is not https; run every controller with --api-tls-cert and --api-tls-key so the leader announces an https URL",
		errLeaderInClear, u.Scheme+"://"+u.Host)
}

// isLoopbackHost reports whether host is a loopback IP or localhost; a name that would need
// DNS is not, since DNS could send it anywhere.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Elector is a leader election on the Lease cfg.Name in the store's namespace, through the
// store's API server: cfg's Client and Namespace are filled in. The client is the election's
// own, with a token bucket of its own, so that Lease renewals never queue behind a burst of
// store writes or launches and the leader does not lose its Lease for being busy.
func (o StoreOptions) Elector(cfg leader.Config) (*leader.Elector, error) {
	rc, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	cfg.Client, cfg.Namespace = cs.CoordinationV1(), o.namespace()
	return leader.New(cfg)
}

// ownCertificate is the DER of --api-tls-cert's first certificate; nil without one.
func (c *Controller) ownCertificate() []byte {
	if c.opts.APITLSCert == "" {
		return nil
	}
	data, err := os.ReadFile(c.opts.APITLSCert)
	if err != nil {
		return nil
	}
	for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
		if block.Type == "CERTIFICATE" {
			return block.Bytes
		}
	}
	return nil
}

package controller

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/internal/store/kubestore"
	kubelauncher "github.com/ferryserve/ferry/launcher/kubernetes"
)

// Store kinds (--store).
const (
	StoreSQLite     = "sqlite"
	StoreKubernetes = "kubernetes"
)

// StoreOptions choose the controller's store.
type StoreOptions struct {
	// Kind is StoreSQLite ("" too: the file in the home) or StoreKubernetes.
	Kind string
	// Kubeconfig and Context reach the API server; both empty means in-cluster.
	Kubeconfig, Context string
	// Namespace holds the state; empty means the pod's namespace, else "ferry".
	Namespace string
	// Fence reports the leader's term (false when this controller does not lead) and Holder is
	// this controller's identity in the Lease; kubestore stamps both on every write. Nil Fence:
	// no election.
	Fence  func() (term int64, ok bool)
	Holder string
	// QPS and Burst rate-limit every Kubernetes client the controller builds, each with a
	// token bucket of its own: the store's, leader election's, the FerryService watch's and
	// each kubernetes infra's (--kube-api-qps, --kube-api-burst). Zeros take
	// kubelauncher.DefaultQPS and DefaultBurst, sized for 1,000 replicas; a negative QPS
	// turns client-side limiting off.
	QPS   float32
	Burst int
}

// Validate checks the rate limit: a burst is a bucket's size, never negative (0 takes the
// default).
func (o StoreOptions) Validate() error {
	if o.Burst < 0 {
		return fmt.Errorf("--kube-api-burst %d: want a positive number (0 for the default, %d)", o.Burst, kubelauncher.DefaultBurst)
	}
	return nil
}

// openStore opens the store Options.Store names, its writes timed once the metrics exist
// (storemetrics.go).
func (c *Controller) openStore() (store.Store, error) {
	st, kind, err := c.opts.Store.open(c.opts.Home.StorePath())
	if ks, ok := st.(*kubestore.Store); ok && err == nil && c.opts.Store.Fence != nil && c.log != nil {
		if ks.Fenced() {
			c.log.Info("kubernetes store: the API server's fencing policy guards its writes")
		} else {
			c.log.Warn("kubernetes store: leader election without the chart's fencing policy in force: the API server does not refuse a deposed leader's writes")
		}
	}
	if err != nil || c.control == nil {
		return st, err
	}
	return timedStore{Store: st, writes: c.control.storeWrites, kind: kind}, nil
}

// open opens the store: SQLite at sqlitePath, or the Kubernetes one; kind is StoreSQLite or
// StoreKubernetes.
func (o StoreOptions) open(sqlitePath string) (st store.Store, kind string, err error) {
	switch o.Kind {
	case "", StoreSQLite:
		st, err := store.OpenSQLite(sqlitePath)
		return st, StoreSQLite, err
	case StoreKubernetes:
		cfg, err := o.restConfig()
		if err != nil {
			return nil, "", err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := kubestore.Open(ctx, kubestore.Options{Config: cfg, Namespace: o.namespace(), Fence: o.Fence, Holder: o.Holder})
		return st, StoreKubernetes, err
	default:
		return nil, "", fmt.Errorf("store %q: want %s or %s", o.Kind, StoreSQLite, StoreKubernetes)
	}
}

// restConfig is the in-cluster configuration without a kubeconfig or context, else the
// kubeconfig's context; rate-limited by QPS and Burst. Each call is a new configuration, and
// each client made from one has its own token bucket.
func (o StoreOptions) restConfig() (*rest.Config, error) {
	cfg, err := o.baseRESTConfig()
	if err != nil {
		return nil, err
	}
	kubelauncher.RateLimit(cfg, o.QPS, o.Burst)
	return cfg, nil
}

// baseRESTConfig is restConfig before its rate limit.
func (o StoreOptions) baseRESTConfig() (*rest.Config, error) {
	if o.Kubeconfig == "" && o.Context == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.Kubeconfig != "" {
		rules.ExplicitPath = o.Kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.Context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("store: kubernetes configuration: %w", err)
	}
	return cfg, nil
}

// namespace is Namespace, else the pod's, else "ferry".
func (o StoreOptions) namespace() string {
	if o.Namespace != "" {
		return o.Namespace
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "ferry"
}

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
}

// openStore opens the store Options.Store names.
func (c *Controller) openStore() (store.Store, error) {
	o := c.opts.Store
	switch o.Kind {
	case "", StoreSQLite:
		return store.OpenSQLite(c.opts.Home.StorePath())
	case StoreKubernetes:
		cfg, err := o.restConfig()
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return kubestore.Open(ctx, kubestore.Options{Config: cfg, Namespace: o.namespace(), Fence: o.Fence, Holder: o.Holder})
	default:
		return nil, fmt.Errorf("store %q: want %s or %s", o.Kind, StoreSQLite, StoreKubernetes)
	}
}

// restConfig is the in-cluster configuration without a kubeconfig or context, else the
// kubeconfig's context.
func (o StoreOptions) restConfig() (*rest.Config, error) {
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

package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ferryserve/ferry/internal/leader"
)

// `ferry controller --leader-elect`: several controllers over the Kubernetes store, one leading
// through a Lease (internal/leader, internal/controller/leadership.go). This file turns the
// flags into a leader.Elector.

// electionFlags are the controller's election flags.
type electionFlags struct {
	enabled   bool
	lease     string
	id        string
	advertise string
}

// addElectionFlags adds the election flags, and the Kubernetes connection flags unless the
// store's flags already did (they are shared: the Lease lives beside the store's objects).
func addElectionFlags(f *pflag.FlagSet, ef *electionFlags, envErrs *[]error) {
	f.BoolVar(&ef.enabled, "leader-elect", envBool("FERRY_LEADER_ELECT", envErrs),
		"run as one of several controllers over --store kubernetes: follow until this one holds the Lease --lease-name, then lead ($FERRY_LEADER_ELECT)")
	f.StringVar(&ef.lease, "lease-name", leader.DefaultLeaseName, "the coordination.k8s.io Lease the controllers elect their leader with, in --namespace")
	f.StringVar(&ef.id, "id", "", "this controller's identity in the Lease (default: hostname-pid)")
	f.StringVar(&ef.advertise, "advertise-url", os.Getenv("FERRY_ADVERTISE_URL"),
		"the URL other controllers and attached proxies reach this controller's --listen API at (default: from --listen, with $POD_IP or the hostname for an unspecified host; $FERRY_ADVERTISE_URL)")
	if f.Lookup("kubeconfig") == nil {
		f.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig for the Kubernetes store and the Lease (default: in-cluster; $KUBECONFIG)")
	}
	if f.Lookup("kube-context") == nil {
		f.String("kube-context", "", "context of --kubeconfig (default: its current context)")
	}
	if f.Lookup("namespace") == nil {
		f.String("namespace", os.Getenv("FERRY_NAMESPACE"), "namespace of the state and the Lease (default: the pod's, else ferry; $FERRY_NAMESPACE)")
	}
}

// elector builds the Elector from the flags; nil without --leader-elect.
func (ef electionFlags) elector(f *pflag.FlagSet, listen string, tls bool, log *zap.Logger) (*leader.Elector, error) {
	if !ef.enabled {
		return nil, nil
	}
	if st, err := f.GetString("store"); err == nil && st != "kubernetes" {
		return nil, errors.New("--leader-elect requires --store kubernetes: the controllers must share their state")
	}
	advertise, err := advertiseURL(ef.advertise, listen, tls)
	if err != nil {
		return nil, err
	}
	kubeconfig, _ := f.GetString("kubeconfig")
	kubeContext, _ := f.GetString("kube-context")
	ns, _ := f.GetString("namespace")
	cfg, err := kubeRESTConfig(kubeconfig, kubeContext)
	if err != nil {
		return nil, err
	}
	if ns == "" {
		ns = inClusterNamespace()
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return leader.New(leader.Config{Client: cs.CoordinationV1(), Namespace: ns, Name: ef.lease, Identity: ef.id, URL: advertise,
		Logger: log.Named("leader")})
}

// advertiseURL is --advertise-url, or the URL of --listen: http(s)://HOST:PORT, where an
// unspecified host (0.0.0.0, ::) becomes $POD_IP or the hostname.
func advertiseURL(explicit, listen string, tls bool) (string, error) {
	if explicit != "" {
		if !strings.HasPrefix(explicit, "http://") && !strings.HasPrefix(explicit, "https://") {
			return "", fmt.Errorf("--advertise-url %q: want http://HOST:PORT or https://HOST:PORT", explicit)
		}
		return strings.TrimRight(explicit, "/"), nil
	}
	if listen == "" || listen == "off" {
		return "", errors.New("--leader-elect needs --listen: followers forward the API to the leader's, and attached proxies follow it there")
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = os.Getenv("POD_IP")
		if host == "" {
			if host, err = os.Hostname(); err != nil {
				return "", fmt.Errorf("--listen %q has no host to advertise; set --advertise-url", listen)
			}
		}
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port), nil
}

// kubeRESTConfig is the in-cluster configuration without a kubeconfig, else the kubeconfig's
// context.
func kubeRESTConfig(kubeconfig, context string) (*rest.Config, error) {
	if kubeconfig == "" && context == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes configuration: %w", err)
	}
	return cfg, nil
}

// inClusterNamespace is the pod's namespace, else "ferry".
func inClusterNamespace() string {
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "ferry"
}

// envBool is envOr for a boolean setting, false when unset; a bad value is added to errs.
func envBool(name string, errs *[]error) bool {
	switch v := strings.ToLower(os.Getenv(name)); v {
	case "", "0", "false", "no":
		return false
	case "1", "true", "yes":
		return true
	default:
		*errs = append(*errs, fmt.Errorf("$%s %q: want true or false", name, v))
		return false
	}
}

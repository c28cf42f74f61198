package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/controller"
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

// addElectionFlags adds the election flags; the Lease is reached with the store's Kubernetes
// flags and lives in its namespace.
func addElectionFlags(f *pflag.FlagSet, ef *electionFlags, envErrs *[]error) {
	f.BoolVar(&ef.enabled, "leader-elect", envBool("FERRY_LEADER_ELECT", envErrs),
		"run as one of several controllers over --store kubernetes: follow until this one holds the Lease --lease-name, then lead ($FERRY_LEADER_ELECT)")
	f.StringVar(&ef.lease, "lease-name", leader.DefaultLeaseName, "the coordination.k8s.io Lease the controllers elect their leader with, in --namespace")
	f.StringVar(&ef.id, "id", "", "this controller's identity in the Lease (default: hostname-pid)")
	f.StringVar(&ef.advertise, "advertise-url", os.Getenv("FERRY_ADVERTISE_URL"),
		"the URL other controllers and attached proxies reach this controller's --listen API at (default: from --listen, with $POD_IP or the hostname for an unspecified host; $FERRY_ADVERTISE_URL)")
}

// apply gives opts an Elector, and the store the term to fence its writes with; nothing
// without --leader-elect.
func (ef electionFlags) apply(opts *controller.Options, log *zap.Logger) error {
	if !ef.enabled {
		return nil
	}
	if opts.Store.Kind != controller.StoreKubernetes {
		return errors.New("--leader-elect requires --store kubernetes: the controllers must share their state")
	}
	advertise, err := advertiseURL(ef.advertise, opts.Listen, opts.APITLSCert != "")
	if err != nil {
		return err
	}
	e, err := opts.Store.Elector(leader.Config{Name: ef.lease, Identity: ef.id, URL: advertise, Logger: log.Named("leader")})
	if err != nil {
		return err
	}
	opts.Elector = e
	opts.Store.Fence = func() (int64, bool) {
		term, _, ok := e.Term()
		return term, ok
	}
	opts.Store.Holder = e.Identity()
	return nil
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

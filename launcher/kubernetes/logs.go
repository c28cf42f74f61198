package kubernetes

import (
	"context"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ferryserve/ferry/launcher"
)

// StreamLogs writes the pod's output, read through the API server's pod log endpoint (which
// asks the node's kubelet): the last opts.Tail lines (all when negative), then with opts.Follow
// what follows until the container ends or ctx ends (nil then). The controller needs pods/log
// get. A pod not yet on a node, or whose container has not started, has no log yet: the API
// server refuses (Bad Request), and so does StreamLogs, with an error of no launcher type. A
// pod that is gone has none: the error wraps launcher.ErrNotFound.
func (p *Provider) StreamLogs(ctx context.Context, id string, opts launcher.LogOptions, w io.Writer) error {
	name, err := p.podName(id)
	if err != nil {
		return err
	}
	logOpts := &corev1.PodLogOptions{Container: containerName, Follow: opts.Follow}
	if opts.Tail >= 0 {
		tail := int64(opts.Tail)
		logOpts.TailLines = &tail
	}
	// A followed log streams for as long as the container runs: not within RequestTimeout.
	client := p.client
	if opts.Follow {
		client = p.streams
	}
	stream, err := client.CoreV1().Pods(p.ns).GetLogs(name, logOpts).Stream(ctx)
	if err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("%w: %s: pod %s: %v", launcher.ErrNotFound, p.infra, name, err)
		case apierrors.IsBadRequest(err):
			// Not on a node yet, or its container not started: not the caller's mistake.
			return fmt.Errorf("%s: read the log of pod %s: %w", p.infra, name, err)
		}
		return p.classify(err, "read the log of pod "+name)
	}
	defer stream.Close()
	opts.NotifyOpened()
	if _, err := io.Copy(w, stream); err != nil {
		if ctx.Err() != nil {
			return nil // the caller stopped following
		}
		// The stream was cut: whatever broke it lies between here and the node.
		return fmt.Errorf("%w: %s: read the log of pod %s: %w", launcher.ErrUnavailable, p.infra, name, err)
	}
	return nil
}

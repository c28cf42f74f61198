package testcluster

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Pod logs. `kubectl logs` and client-go's GetLogs ask the API server, which asks the kubelet
// of the pod's node: GET https://<node InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>
// /containerLogs/<namespace>/<pod>/<container>?tailLines=N&follow=true. kwok advertises
// 127.0.0.1 and the cluster's KubeletPort for every node, and the API server runs with
// --kubelet-preferred-address-types=InternalIP (cluster.go); the stand-in answers there from
// the pod's log file. The container name is not checked (pods have one), and timestamps,
// sinceSeconds and limitBytes are ignored. A follow ends when the pod's process has exited
// and its output is all sent, as a kubelet's ends with its container.

// logPollInterval is how often a follow looks for new output.
const logPollInterval = 100 * time.Millisecond

// logServer serves /containerLogs over TLS.
type logServer struct {
	ln  net.Listener
	srv *http.Server
}

// listenLogs takes the cluster's kubelet port.
func (k *Kubelet) listenLogs() (*logServer, error) {
	cert, err := selfSignedCert()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(k.cluster.KubeletPort()))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("kubelet stand-in: listen on the nodes' kubelet port (is another stand-in running for this cluster?): %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.serveContainerLogs)
	return &logServer{
		ln:  tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
	}, nil
}

func (s *logServer) serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops serving and ends every follow.
func (s *logServer) Close() { _ = s.srv.Close() }

// serveContainerLogs writes a pod's log: the last tailLines lines (all without it), then with
// follow=true what the process writes until it exits.
func (k *Kubelet) serveContainerLogs(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("pod")
	tail := -1
	if v := r.URL.Query().Get("tailLines"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			http.Error(w, "tailLines must be a non-negative integer", http.StatusBadRequest)
			return
		}
		tail = n
	}
	follow, _ := strconv.ParseBool(r.URL.Query().Get("follow"))
	f, err := os.Open(k.LogPath(ns, name))
	if errors.Is(err, os.ErrNotExist) && follow && k.followable(ns, name) {
		// Not started yet: wait for its first output, as kubectl logs -f waits.
		for errors.Is(err, os.ErrNotExist) && k.followable(ns, name) {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(logPollInterval):
			}
			f, err = os.Open(k.LogPath(ns, name))
		}
	}
	if err != nil {
		http.Error(w, fmt.Sprintf("no log for pod %s/%s", ns, name), http.StatusNotFound)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	flusher, _ := w.(http.Flusher)
	data, err := io.ReadAll(f)
	if err != nil {
		return
	}
	_, _ = w.Write(lastLines(data, tail))
	if flusher != nil {
		flusher.Flush()
	}
	if !follow {
		return
	}
	for {
		alive := k.followable(ns, name) // before reading: what it wrote before exiting is read after
		n, err := io.Copy(w, f)
		if err != nil {
			return
		}
		if n > 0 && flusher != nil {
			flusher.Flush()
		}
		if !alive {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(logPollInterval):
		}
	}
}

// followable reports whether a pod's process runs, is being started, or is yet to start: a
// follow waits for more.
func (k *Kubelet) followable(ns, name string) bool {
	key := ns + "/" + name
	k.mu.Lock()
	rec, starting := k.replicas[key], k.starting[key]
	k.mu.Unlock()
	if starting {
		// Its marker and log file may exist before its process is in replicas: without this
		// a follow in that window read an empty or partial log and ended as if it had exited.
		return true
	}
	if rec != nil {
		return !rec.proc.exited()
	}
	pod, err := k.pods.Pods(ns).Get(name)
	if err != nil || pod.DeletionTimestamp != nil || !isJobPod(pod) {
		return false
	}
	if pod.Status.Phase != corev1.PodPending && pod.Status.Phase != corev1.PodRunning {
		return false
	}
	return !fileExists(filepath.Join(k.podDir(pod.UID), "started"))
}

// markStarting records that key's process is being started, until the returned func is
// called (once the process is in replicas, or failed to start).
func (k *Kubelet) markStarting(key string) (done func()) {
	k.mu.Lock()
	k.starting[key] = true
	k.mu.Unlock()
	return func() {
		k.mu.Lock()
		delete(k.starting, key)
		k.mu.Unlock()
	}
}

// lastLines is the end of data holding n lines (all of it when n < 0).
func lastLines(data []byte, n int) []byte {
	if n < 0 {
		return data
	}
	if n == 0 {
		return nil
	}
	end := len(data)
	if end > 0 && data[end-1] == '\n' {
		end-- // the last line's own newline
	}
	for i := 0; i < n; i++ {
		j := bytes.LastIndexByte(data[:end], '\n')
		if j < 0 {
			return data
		}
		end = j
	}
	return data[end+1:]
}

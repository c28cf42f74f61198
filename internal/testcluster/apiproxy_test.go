package testcluster

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestAPIProxyStopStart: through the proxy, the API server answers; stopped, a new request is
// refused and an open watch is cut, while the cluster's own clients are undisturbed; started
// again, it answers on the same address, through the same client.
func TestAPIProxyStopStart(t *testing.T) {
	c := Shared(t)
	proxy := c.APIProxy(t)
	ctx := context.Background()

	client, err := kubernetes.NewForConfig(proxy.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	// The kubeconfig names the same address.
	fromFile, err := clientcmd.BuildConfigFromFlags("", proxy.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	if fromFile.Host != proxy.RESTConfig().Host || fromFile.Host != "https://"+proxy.Addr() {
		t.Errorf("kubeconfig server %s, rest config %s, proxy %s: want one address", fromFile.Host, proxy.RESTConfig().Host, proxy.Addr())
	}
	fileClient, err := kubernetes.NewForConfig(fromFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fileClient.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("through the proxy's kubeconfig: %v", err)
	}

	w, err := client.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	if proxy.Stopped() {
		t.Fatal("a started proxy says it is stopped")
	}
	proxy.Stop()
	if !proxy.Stopped() {
		t.Fatal("a stopped proxy says it is not")
	}
	// The open watch is cut: its channel closes (after any events already sent).
	cut := time.After(30 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-w.ResultChan():
		case <-cut:
			t.Fatal("the watch open through the proxy was not cut by Stop")
		}
	}
	// A new connection is refused, at once.
	began := time.Now()
	_, err = client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("request through a stopped proxy: %v, want connection refused", err)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("refused after %v, want at once", d)
	}
	// Everybody else still reaches the API server.
	if _, err := c.Client().CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("the cluster's own client while the proxy is stopped: %v", err)
	}

	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Start(); err != nil {
		t.Fatalf("starting a started proxy: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("through the restarted proxy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	proxy.Close()
	if err := proxy.Start(); err == nil {
		t.Error("a closed proxy started again")
	}
}

// TestAPIProxyHang: hanging, the proxy accepts connections and never answers, so a request
// ends only by its client's deadline; started again, it answers.
func TestAPIProxyHang(t *testing.T) {
	c := Shared(t)
	proxy := c.APIProxy(t)
	cfg := proxy.RESTConfig()
	cfg.Timeout = 2 * time.Second
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	if err := proxy.Hang(); err != nil {
		t.Fatal(err)
	}
	if proxy.Stopped() {
		t.Error("a hanging proxy says it is stopped")
	}
	began := time.Now()
	_, err = client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
	took := time.Since(began)
	if err == nil || errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("request through a hanging proxy: %v, want no answer", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("request through a hanging proxy: %v, want its deadline exceeded", err)
	}
	if took < cfg.Timeout || took > cfg.Timeout+10*time.Second {
		t.Errorf("request through a hanging proxy ended after %v, want its timeout %v", took, cfg.Timeout)
	}

	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("through the proxy after the hang: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/ferryserve/ferry/policy"
)

// Adapters loaded on demand (service.adapters.load: on_demand): before a request for such an
// adapter goes to a replica that has not registered it, the proxy registers it there through
// vLLM's /v1/load_lora_adapter, once per replica however many requests wait for it, and unloads
// the replica's least recently used adapter beyond MaxLoadedAdapters that none of this proxy's
// requests is using. Routing (least_ttft) already prefers replicas that have the adapter, so a
// load happens where routing chose to spread or place it.

const (
	// adapterLoadTimeout bounds one load: vLLM reads the adapter's weights, from local disk
	// or a model hub, before it answers.
	adapterLoadTimeout = 2 * time.Minute
	// adapterUnloadTimeout bounds an unload, which only drops the registration.
	adapterUnloadTimeout = 10 * time.Second
)

var (
	pathLoadLoRA   = []byte("/v1/load_lora_adapter")
	pathUnloadLoRA = []byte("/v1/unload_lora_adapter")
	// errAdapterLoad marks a request whose adapter could not be loaded on its replica: another
	// replica may do better, as after a dial error.
	errAdapterLoad = errors.New("proxy: loading the LoRA adapter failed")
)

// loadedAdapters is what the proxy registered on one replica (per address, on its hostClient):
// adapters by last use, most recent first, and loads under way.
type loadedAdapters struct {
	mu      sync.Mutex
	recent  []string
	loading map[string]*adapterLoad
}

// adapterLoad is one load under way; the requests that wait for it read err once done closes.
type adapterLoad struct {
	done chan struct{}
	err  error
}

// ensureAdapter registers the request's on-demand adapter on the replica behind c when this
// proxy has not yet, waiting for a load another request started. It returns an error wrapping
// errAdapterLoad when the load failed.
func (s *Service) ensureAdapter(ex *exchange, r *policy.Replica, c *hostClient) error {
	if ex.info.Adapter == 0 || len(s.cfg.LoadAdapters) == 0 {
		return nil
	}
	path, ok := s.cfg.LoadAdapters[string(ex.info.Model)]
	if !ok {
		return nil // registered at start, or not an adapter of the YAML
	}
	name := string(ex.info.Model)
	la := &c.adapters
	la.mu.Lock()
	if i := slices.Index(la.recent, name); i >= 0 {
		copy(la.recent[1:i+1], la.recent[:i])
		la.recent[0] = name
		la.mu.Unlock()
		return nil
	}
	load, started := la.loading[name]
	if !started {
		load = &adapterLoad{done: make(chan struct{})}
		if la.loading == nil {
			la.loading = map[string]*adapterLoad{}
		}
		la.loading[name] = load
	}
	la.mu.Unlock()
	if started {
		<-load.done
		return load.err
	}
	load.err = s.loadAdapter(c, name, path)
	s.countAdapterLoad(ex.info.Adapter, name, load.err)
	la.mu.Lock()
	delete(la.loading, name)
	var victims []string
	if load.err == nil {
		la.recent = slices.Insert(la.recent, 0, name)
		victims = s.adapterVictimsLocked(la, r)
	}
	la.mu.Unlock()
	close(load.done)
	for _, v := range victims {
		go s.unloadAdapter(c, v)
	}
	return load.err
}

// adapterVictimsLocked removes from la the least recently used adapters beyond
// MaxLoadedAdapters that no request of this proxy is using on r, and returns them.
func (s *Service) adapterVictimsLocked(la *loadedAdapters, r *policy.Replica) []string {
	var out []string
	for i := len(la.recent) - 1; i >= 0 && len(la.recent) > s.cfg.MaxLoadedAdapters; i-- {
		name := la.recent[i]
		if a := s.adapters.Lookup([]byte(name)); a != 0 && r.AdapterInFlight(a-1) > 0 {
			continue
		}
		out = append(out, name)
		la.recent = slices.Delete(la.recent, i, i+1)
	}
	return out
}

// forgetAdapter drops a registration the replica no longer has (it answered 404 for it: it
// restarted, or another proxy unloaded it), so that the next request loads it again.
func (c *hostClient) forgetAdapter(name []byte) {
	la := &c.adapters
	la.mu.Lock()
	defer la.mu.Unlock()
	if i := slices.Index(la.recent, string(name)); i >= 0 {
		la.recent = slices.Delete(la.recent, i, i+1)
	}
}

// loadAdapter asks the replica to register an adapter. vLLM answers 400 "has already been
// loaded" when another proxy (or its --lora-modules) did: that is a success here.
func (s *Service) loadAdapter(c *hostClient, name, path string) error {
	body, _ := json.Marshal(map[string]string{"lora_name": name, "lora_path": path})
	start := time.Now()
	code, answer, err := s.adapterCall(c, pathLoadLoRA, body, adapterLoadTimeout)
	switch {
	case err == nil && (code == fasthttp.StatusOK || code == fasthttp.StatusBadRequest && bytes.Contains(answer, []byte("already been loaded"))):
		if ce := s.log.Check(zap.DebugLevel, "LoRA adapter loaded"); ce != nil {
			ce.Write(zap.String("adapter", name), zap.String("addr", c.addr), zap.Duration("took", time.Since(start)))
		}
		return nil
	case err == nil:
		err = fmt.Errorf("status %d: %.200s", code, answer)
	}
	if ce := s.log.Check(zap.WarnLevel, "could not load a LoRA adapter on a replica"); ce != nil {
		ce.Write(zap.String("adapter", name), zap.String("addr", c.addr), zap.Error(err))
	}
	return fmt.Errorf("%w %s on %s: %w", errAdapterLoad, name, c.addr, err)
}

func (s *Service) unloadAdapter(c *hostClient, name string) {
	body, _ := json.Marshal(map[string]string{"lora_name": name})
	code, answer, err := s.adapterCall(c, pathUnloadLoRA, body, adapterUnloadTimeout)
	if err == nil && (code == fasthttp.StatusOK || code == fasthttp.StatusNotFound) {
		return
	}
	if err == nil {
		err = fmt.Errorf("status %d: %.200s", code, answer)
	}
	if ce := s.log.Check(zap.DebugLevel, "could not unload a LoRA adapter"); ce != nil {
		ce.Write(zap.String("adapter", name), zap.String("addr", c.addr), zap.Error(err))
	}
}

// adapterCall POSTs a JSON body to the replica through a client of its own (c.hc is the
// handler's; see binder) and returns the status and body.
func (s *Service) adapterCall(c *hostClient, path, body []byte, timeout time.Duration) (int, []byte, error) {
	hc := c.sideClient(s.dial, "ferry-adapters", 1<<20)
	defer hc.CloseIdleConnections()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURIBytes(path)
	req.Header.SetHost(c.addr)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := hc.DoTimeout(req, resp, timeout); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

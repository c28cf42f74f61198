package proxy

import (
	"bytes"
	"encoding/json"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Model discovery: a gateway routes by the request's "model", but a service is named by its
// user ("llama") while clients ask for the model id the replica serves
// ("meta-llama/Llama-3.1-8B-Instruct"). So when a replica joins, the proxy asks its
// /v1/models once, off the request path, and the service answers to its own name and to every
// id its replicas report.

const (
	modelsFetchTimeout  = 5 * time.Second
	modelsFetchAttempts = 5
	modelsFetchBackoff  = time.Second
	// maxModelIDs bounds what one replica may add to the routing table.
	maxModelIDs = 64
	// maxModelsBody bounds a replica's /v1/models answer: 64 ids with vLLM's metadata each
	// (permissions, max_model_len, root) take a few tens of KiB.
	maxModelsBody = 1 << 20
)

var pathModels = []byte("/v1/models")

// fetchModels asks a newly added replica for its model ids, retrying with backoff while the
// client stays in the service, then tells the gateway (if any) that the table changed.
func (s *Service) fetchModels(c *hostClient) {
	backoff := modelsFetchBackoff
	for attempt := 1; attempt <= modelsFetchAttempts && !c.retired.Load(); attempt++ {
		ids, adapters, err := c.modelIDs(s.dial)
		if err == nil {
			s.adapters.Add(adapters...)
			c.models.Store(&ids)
			s.modelsChanged()
			return
		}
		if ce := s.log.Check(zap.DebugLevel, "could not list a replica's models"); ce != nil {
			ce.Write(zap.String("addr", c.addr), zap.Int("attempt", attempt), zap.Error(err))
		}
		select {
		case <-time.After(backoff):
		case <-s.stopped:
			return
		}
		backoff *= 2
	}
}

type modelList struct {
	Data []struct {
		ID string `json:"id"`
		// Parent is the base model of a LoRA adapter (vLLM lists adapters so).
		Parent string `json:"parent"`
	} `json:"data"`
}

// modelIDs asks the replica for its models through a client of its own: c.hc is the handler's
// (see binder). adapters are the ids that name a parent model: LoRA adapters.
func (c *hostClient) modelIDs(dial func(string) (net.Conn, error)) (ids, adapters []string, err error) {
	hc := c.sideClient(dial, "ferry-models", maxModelsBody)
	defer hc.CloseIdleConnections()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.SetRequestURIBytes(pathModels)
	req.Header.SetHost(c.addr)
	c.acquire()
	defer c.release()
	if err := hc.DoTimeout(req, resp, modelsFetchTimeout); err != nil {
		return nil, nil, err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return nil, nil, &statusError{code: resp.StatusCode()}
	}
	var list modelList
	if err := json.Unmarshal(resp.Body(), &list); err != nil {
		return nil, nil, err
	}
	ids = make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" && !slices.Contains(ids, m.ID) && len(ids) < maxModelIDs {
			ids = append(ids, m.ID)
			if m.Parent != "" && m.Parent != m.ID {
				adapters = append(adapters, m.ID)
			}
		}
	}
	return ids, adapters, nil
}

// sideClient is a client of one connection to the replica, for the proxy's own calls (its
// models, its adapters): c.hc is the handler's (see binder). It never retries.
func (c *hostClient) sideClient(dial func(string) (net.Conn, error), name string, maxBody int) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: c.addr, Dial: dial, MaxConns: 1, MaxIdemponentCallAttempts: 1,
		RetryIfErr: func(*fasthttp.Request, int, error) (bool, bool) { return false, false }, Name: name,
		SecureErrorLogMessage: true, MaxResponseBodySize: maxBody}
}

// Models returns the model ids the service answers to on a gateway: its own name first, then
// the ids its current replicas reported and the LoRA adapters it declares, without duplicates. While no current replica has
// reported any (scaled to zero, or the first replica after zero still starting), it keeps
// answering to the ids its replicas last reported, so that a request by model id reaches the
// service and is held there until a replica is ready, instead of getting 404.
func (s *Service) Models() []string {
	out := []string{s.cfg.Name}
	out = appendModelIDs(out, s.snap.Load())
	if len(out) == 1 {
		if last := s.lastModels.Load(); last != nil {
			for _, id := range *last {
				if !slices.Contains(out, id) {
					out = append(out, id)
				}
			}
		}
	}
	// Declared adapters, which an on_demand service's replicas list only once loaded there:
	// the gateway must route them here before any replica has one.
	for _, a := range s.cfg.Adapters {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// appendModelIDs appends the ids the replicas of snap reported and dst does not hold yet.
func appendModelIDs(dst []string, snap *snapshot) []string {
	for _, c := range snap.clients {
		if ids := c.models.Load(); ids != nil {
			for _, id := range *ids {
				if !slices.Contains(dst, id) {
					dst = append(dst, id)
				}
			}
		}
	}
	return dst
}

// rememberModels keeps the ids the replicas of old reported, before SetBackends replaces it,
// for Models to fall back on. Ids the next replicas report then take over, so a rollout to
// another model still drops the old one once a new replica has answered.
func (s *Service) rememberModels(old *snapshot) {
	if ids := appendModelIDs(nil, old); len(ids) > 0 {
		s.lastModels.Store(&ids)
	}
}

// KeepModels makes s answer to the model ids prev's replicas reported until its own replicas
// report theirs, as a service scaled to zero keeps answering to its last ones (Models). A
// Service that takes prev's place in a gateway (a new configuration of the same service)
// starts with no ids of its own until it has asked its replicas, and without this the
// gateway would answer prev's models 404 for that moment.
func (s *Service) KeepModels(prev *Service) {
	ids := appendModelIDs(nil, prev.snap.Load())
	if len(ids) == 0 {
		if last := prev.lastModels.Load(); last != nil {
			ids = slices.Clone(*last)
		}
	}
	if len(ids) > 0 {
		s.lastModels.Store(&ids)
	}
}

// Name returns the service's name.
func (s *Service) Name() string { return s.cfg.Name }

// watchModels makes the service discover its replicas' model ids and call f whenever they may
// have changed. Replicas already present are asked now.
func (s *Service) watchModels(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onModels.Store(&f)
	for _, c := range s.snap.Load().clients {
		if c.models.Load() == nil {
			go s.fetchModels(c)
		}
	}
}

func (s *Service) modelsChanged() {
	if f := s.onModels.Load(); f != nil {
		(*f)()
	}
}

// modelsHook is how a gateway hears that a service's model ids changed.
type modelsHook = atomic.Pointer[func()]

// modelEntry is one model of a /v1/models answer, in vLLM's shape.
type modelEntry struct {
	ID      string  `json:"id"`
	Object  string  `json:"object"`
	Created int64   `json:"created"`
	OwnedBy string  `json:"owned_by"`
	Root    string  `json:"root"`
	Parent  *string `json:"parent"`
}

// answerModels answers GET /v1/models itself for a service that loads adapters on demand: a
// replica lists only the adapters registered on it, while the service serves every adapter it
// declares (registered at its first request), so the answer is the replicas' models and every
// declared adapter, as vLLM lists adapters (root: the adapter's path; parent: the base model).
// It reports whether it answered: not for other requests, nor before any replica has said which
// base model it serves (the request then goes to a replica, held until one is READY).
func (s *Service) answerModels(ctx *fasthttp.RequestCtx) bool {
	if len(s.cfg.LoadAdapters) == 0 || !ctx.IsGet() || !bytes.Equal(ctx.Path(), pathModels) {
		return false
	}
	ids := appendModelIDs(nil, s.snap.Load())
	if len(ids) == 0 {
		if last := s.lastModels.Load(); last != nil {
			ids = *last
		}
	}
	baseAt := slices.IndexFunc(ids, func(id string) bool {
		_, declared := s.cfg.LoadAdapters[id]
		return !declared && s.adapters.Lookup([]byte(id)) == 0
	})
	if baseAt < 0 {
		return false
	}
	base, now := ids[baseAt], time.Now().Unix()
	list := struct {
		Object string       `json:"object"`
		Data   []modelEntry `json:"data"`
	}{Object: "list"}
	for _, id := range slices.Concat(ids, s.cfg.Adapters) {
		if slices.ContainsFunc(list.Data, func(m modelEntry) bool { return m.ID == id }) {
			continue
		}
		m := modelEntry{ID: id, Object: "model", Created: now, OwnedBy: "vllm", Root: id}
		if id != base && (s.adapters.Lookup([]byte(id)) != 0 || s.cfg.LoadAdapters[id] != "") {
			m.Parent = &base
			if path := s.cfg.LoadAdapters[id]; path != "" {
				m.Root = path
			}
		}
		list.Data = append(list.Data, m)
	}
	body, err := json.Marshal(list)
	if err != nil {
		return false
	}
	ctx.SetContentTypeBytes(contentTypeJSON)
	ctx.SetBody(body)
	s.answeredSelf(ctx, nil)
	return true
}

package proxy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// GatewayConfig configures a Gateway. Zero values select the defaults of ServiceConfig.
type GatewayConfig struct {
	// MaxRequestBodySize bounds bodies read before the service is known; each service's own
	// limit then applies too. Default DefaultMaxRequestBodySize.
	MaxRequestBodySize int
	// IdleTimeout is the per-write idle deadline on client connections. Default
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// TLS, when set, terminates TLS on every listener.
	TLS *tls.Config
	// Guard applies the process's ClientLimits; pass the one the services share. Nil shares the
	// process default.
	Guard  *Guard
	Logger *zap.Logger
	// Metrics counts the requests the gateway answers itself (unknown model, bad JSON) in
	// ferry_gateway_errors_total; pass the Metrics the services share. Nil counts none.
	Metrics *Metrics
	// AccessLog gets one sampled line per request the gateway answers itself; requests it
	// hands to a service are logged by that service. Nil logs none.
	AccessLog *zap.Logger
	// Tracing starts each request's span, named "gateway", which the service it goes to
	// continues (tracing.go); pass the services' Tracing. Nil records none.
	Tracing *Tracing
}

// Gateway is one endpoint for many services: the request body's "model" picks the service,
// and GET /v1/models lists every model. A service answers to its own name and to the model ids
// its replicas report (see Service.Models). Everything after the choice of service — auth,
// limits, routing, retries, streaming — is that service's Handler.
type Gateway struct {
	cfg   GatewayConfig
	log   *zap.Logger
	front frontend
	errs  gatewayErrors
	// accessLog is cfg.AccessLog, sampled; nil when there is none. refusedLog is the same with a
	// sampler of its own, for refused API keys (accesslog.go).
	accessLog, refusedLog *zap.Logger
	// authFailures limits failed API key attempts per address (auth.go).
	authFailures *rateLimiter

	// table is the current model → service map; the request path only loads it.
	table atomic.Pointer[gatewayTable]

	mu       sync.Mutex // serializes SetServices and rebuilds; guards services
	services []*Service

	// closeConns is set by CloseConnections: the proxy is draining before it stops.
	closeConns atomic.Bool
}

type gatewayTable struct {
	byModel map[string]*Service
	// models is the /v1/models listing, in a stable order.
	models []gatewayModel
	// keys holds the API keys of every service that requires one (anyKeyed); when there are
	// services and all require one (allKeyed), a request carrying none of them is refused at
	// its headers.
	keys               *apiKeys
	anyKeyed, allKeyed bool
}

type gatewayModel struct {
	id  string
	svc *Service
}

type gatewayErrors struct {
	errorBodies
	noModel, notFound []byte
}

// NewGateway returns a Gateway with no services: every model is unknown until SetServices.
func NewGateway(cfg GatewayConfig) *Gateway {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.MaxRequestBodySize <= 0 {
		cfg.MaxRequestBodySize = DefaultMaxRequestBodySize
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	g := &Gateway{
		cfg:          cfg,
		authFailures: newAuthFailureLimiter(),
		log:          cfg.Logger.With(zap.String("listener", "gateway")),
		errs: gatewayErrors{
			errorBodies: newErrorBodies("gateway", cfg.MaxRequestBodySize),
			noModel:     openAIError("you must provide a model parameter", "invalid_request_error", "missing_model"),
			notFound: openAIError("unknown path: the gateway serves the OpenAI API (POST /v1/... with a model, GET /v1/models)",
				"invalid_request_error", "unknown_url"),
		},
	}
	if cfg.AccessLog != nil {
		g.accessLog = sampledAccessLogger(cfg.AccessLog, zap.String("listener", "gateway"))
		g.refusedLog = sampledAccessLogger(cfg.AccessLog, zap.String("listener", "gateway"))
	}
	g.table.Store(&gatewayTable{byModel: map[string]*Service{}})
	g.front.server = newServer(g.serveRequest, g.requestError, g.headerReceived, cfg.MaxRequestBodySize, defaultRequestReadTimeout, g.log)
	g.front.guard, g.front.log = guardOr(cfg.Guard), g.log
	return g
}

// SetServices replaces the services the gateway routes to. Each joins model discovery.
func (g *Gateway) SetServices(services []*Service) {
	g.mu.Lock()
	g.services = slices.Clone(services)
	g.mu.Unlock()
	for _, s := range services {
		s.watchModels(g.rebuild)
	}
	g.rebuild()
}

// rebuild recomputes the model table. Service names win over model ids, and among services
// reporting the same id the first by name wins (logged): routing must not flip between them.
func (g *Gateway) rebuild() {
	g.mu.Lock()
	defer g.mu.Unlock()
	services := slices.Clone(g.services)
	sort.Slice(services, func(i, j int) bool { return services[i].Name() < services[j].Name() })
	t := &gatewayTable{byModel: make(map[string]*Service, len(services)), allKeyed: len(services) > 0, keys: &apiKeys{}}
	for _, s := range services {
		t.byModel[s.Name()] = s
		if s.keys == nil {
			t.allKeyed = false
		} else {
			t.anyKeyed = true
			t.keys.hashes = append(t.keys.hashes, s.keys.hashes...)
			t.keys.managed = cmp.Or(t.keys.managed, s.tenancy)
		}
	}
	for _, s := range services {
		for _, id := range s.Models() {
			if owner, taken := t.byModel[id]; taken && owner != s {
				g.log.Warn("two services serve the same model; routing it to the first", zap.String("model", id),
					zap.String("service", owner.Name()), zap.String("ignored", s.Name()))
				continue
			}
			t.byModel[id] = s
			t.models = append(t.models, gatewayModel{id: id, svc: s})
		}
	}
	g.table.Store(t)
}

var (
	pathHealth       = []byte("/health")
	pathModelsPrefix = []byte("/v1/models/")
)

// Handler routes one request.
func (g *Gateway) Handler(ctx *fasthttp.RequestCtx) {
	if t := g.cfg.Tracing; t != nil {
		defer t.beginGateway(ctx).handled(ctx)
	}
	if v := g.front.guard.bodies.take(&ctx.Request.Header); v.refusal != refuseNone {
		g.reject(ctx, fasthttp.StatusServiceUnavailable, g.errs.bodiesBusy, reasonBodiesBusy)
		return
	}
	path := ctx.Path()
	t := g.table.Load()
	switch {
	case bytes.Equal(path, pathModels) && ctx.IsGet():
		g.listModels(ctx, t, nil)
		return
	case bytes.HasPrefix(path, pathModelsPrefix) && ctx.IsGet():
		g.listModels(ctx, t, path[len(pathModelsPrefix):])
		return
	case bytes.Equal(path, pathHealth) && ctx.IsGet():
		ctx.SetContentTypeBytes(contentTypeJSON)
		ctx.SetBodyString(`{"status":"ok"}`)
		return
	case !ctx.IsPost():
		g.reject(ctx, fasthttp.StatusNotFound, g.errs.notFound, reasonUnknownPath)
		return
	}
	if t.allKeyed && len(ctx.Request.Body()) == 0 {
		if c := presented(&ctx.Request.Header); !t.keys.allows(&c) {
			// No service would take it; headerReceived may have cut its body.
			g.unauthorized(ctx)
			return
		}
	}
	f, err := scanBody(ctx.Request.Body())
	switch {
	case err != nil:
		g.reject(ctx, fasthttp.StatusBadRequest, g.errs.badJSON, reasonBadJSON)
		return
	case len(f.Model) == 0:
		g.reject(ctx, fasthttp.StatusBadRequest, g.errs.noModel, reasonNoModel)
		return
	}
	model, ok := unescapedModel(f.Model)
	if !ok {
		g.reject(ctx, fasthttp.StatusBadRequest, g.errs.badJSON, reasonBadJSON)
		return
	}
	g.route(ctx, t, t.byModel[string(model)], model) // no allocation: the compiler reads the bytes in place
}

// route hands the request to svc (nil: no service serves model) so that a caller learns nothing
// about models it may not use. Without a key of any service, an unknown model gets 401 like a
// protected one, when some service requires a key; with one service's key, another's protected
// model gets 404 like an unknown one. A protected service's key is matched here once and its
// index handed to the service.
func (g *Gateway) route(ctx *fasthttp.RequestCtx, t *gatewayTable, svc *Service, model []byte) {
	c := presented(&ctx.Request.Header)
	switch {
	case svc == nil && t.anyKeyed && !t.keys.allows(&c):
		g.unauthorized(ctx)
	case svc == nil:
		g.reject(ctx, fasthttp.StatusNotFound, modelNotFound(model), reasonUnknownModel)
	case svc.keys == nil:
		svc.Handler(ctx)
	default:
		if i, ok := svc.keys.match(&c); ok {
			svc.handle(ctx, int32(i)+1)
		} else if svc.tenancy.allows(&c) {
			svc.Handler(ctx) // a managed key: the service checks its scope
		} else if t.keys.allows(&c) {
			g.reject(ctx, fasthttp.StatusNotFound, modelNotFound(model), reasonUnknownModel)
		} else {
			svc.Handler(ctx) // 401, from the service, as any request without a valid key
		}
	}
}

// unescapedModel is the value of the body's "model" string from its JSON spelling (scanBody
// leaves escapes in place): "ferry\u002dsim" is ferry-sim. Only a model with an escape, which
// no client needs to send, costs a decode.
func unescapedModel(raw []byte) ([]byte, bool) {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, true
	}
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	var s string
	if err := json.Unmarshal(quoted, &s); err != nil {
		return nil, false
	}
	return []byte(s), true
}

// modelNotFound is OpenAI's 404 for a model that does not exist or that the caller may not use.
// It echoes the model name as OpenAI does, cut short so a huge name cannot bloat the answer.
func modelNotFound(model []byte) []byte {
	const maxEcho = 256
	if len(model) > maxEcho {
		model = model[:maxEcho]
	}
	return openAIError(fmt.Sprintf("The model `%s` does not exist or you do not have access to it", model), "invalid_request_error", "model_not_found")
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// listModels answers GET /v1/models (id nil) or GET /v1/models/{id}. Models of a service that
// requires an API key are shown only to requests carrying one of its keys.
func (g *Gateway) listModels(ctx *fasthttp.RequestCtx, t *gatewayTable, id []byte) {
	c := presented(&ctx.Request.Header)
	visible := func(s *Service) bool { return s.keys == nil || s.keys.allows(&c) }
	ctx.SetContentTypeBytes(contentTypeJSON)
	if id != nil {
		s := t.byModel[string(id)]
		if s == nil || !visible(s) {
			g.reject(ctx, fasthttp.StatusNotFound, modelNotFound(id), reasonUnknownModel)
			return
		}
		body, _ := json.Marshal(modelObject{ID: string(id), Object: "model", OwnedBy: "ferry:" + s.Name()})
		ctx.SetBody(body)
		return
	}
	list := struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{Object: "list", Data: []modelObject{}}
	for _, m := range t.models {
		if visible(m.svc) {
			list.Data = append(list.Data, modelObject{ID: m.id, Object: "model", OwnedBy: "ferry:" + m.svc.Name()})
		}
	}
	body, _ := json.Marshal(list)
	ctx.SetBody(body)
}

func (g *Gateway) requestError(ctx *fasthttp.RequestCtx, err error) {
	g.front.guard.bodies.take(&ctx.Request.Header) // the body will not be read further
	g.errs.writeRequestError(ctx, err)
	g.observe(ctx, ctx.Response.StatusCode(), reasonBadRequest)
}

// Why the gateway answered a request itself; the reason label of ferry_gateway_errors_total
// and the error field of its access log line.
const (
	reasonUnknownPath  = "unknown_path"
	reasonBadJSON      = "bad_json"
	reasonNoModel      = "no_model"
	reasonUnknownModel = "unknown_model"
	reasonBadRequest   = "bad_request"  // unreadable HTTP: too large, malformed, too slow
	reasonUnauthorized = "unauthorized" // no service's API key, when every service requires one
	reasonBodiesBusy   = "bodies_busy"  // the process's budget of bodies being read is spent
)

// unauthorized refuses a request that carries no key of any service (refuseKey).
func (g *Gateway) unauthorized(ctx *fasthttp.RequestCtx) {
	refuseKey(ctx, g.authFailures, &g.errs.errorBodies)
	g.observe(ctx, ctx.Response.StatusCode(), reasonUnauthorized)
}

// reject writes one of the gateway's own errors and records it.
func (g *Gateway) reject(ctx *fasthttp.RequestCtx, status int, body []byte, reason string) {
	writeError(ctx, status, body)
	g.observe(ctx, status, reason)
}

// observe counts a request the gateway answered itself and logs it. These are client mistakes,
// so the line carries no body and no model name: a typo'd model is user input, and the 404
// already echoes it to the only party who needs it.
func (g *Gateway) observe(ctx *fasthttp.RequestCtx, status int, reason string) {
	if g.cfg.Metrics != nil {
		g.cfg.Metrics.gatewayErrors.WithLabelValues(strconv.Itoa(status), reason).Inc()
	}
	log := g.accessLog
	if reason == reasonUnauthorized {
		log = g.refusedLog
	}
	if log == nil {
		return
	}
	ce := log.Check(zap.InfoLevel, accessLogMessage)
	if ce == nil {
		return
	}
	fields := []zap.Field{
		zap.String("method", string(ctx.Method())),
		zap.String("path", loggedPath(ctx.Request.Header.RequestURI())),
		zap.Int("status", status),
		zap.String("error", reason),
		zap.Duration("duration", time.Since(ctx.Time())),
	}
	if ip := clientAddr(ctx); ip.IsValid() {
		fields = append(fields, zap.String("client_ip", ip.String()))
	}
	ce.Write(fields...)
}

// serveRequest is Handler as Serve mounts it: after CloseConnections every response also
// closes its connection.
func (g *Gateway) serveRequest(ctx *fasthttp.RequestCtx) {
	g.Handler(ctx)
	if g.closeConns.Load() {
		ctx.SetConnectionClose()
	}
}

// CloseConnections makes every response from now on close its client connection, as
// Service.CloseConnections does for one service's endpoint: a gateway about to stop calls it as
// it turns unready (Readiness.DrainFor), so keep-alive clients reconnect elsewhere.
func (g *Gateway) CloseConnections() { g.closeConns.Store(true) }

var _ ConnectionCloser = (*Gateway)(nil)

// Serve accepts connections on ln until Shutdown, then returns nil.
func (g *Gateway) Serve(ln net.Listener) error {
	return g.front.serve(ln, g.cfg.IdleTimeout, g.cfg.TLS)
}

// Shutdown stops accepting connections and waits for open ones to finish or ctx to end. The
// services keep their own in-flight accounting: shut them down after the gateway to drain
// streams that came through it.
func (g *Gateway) Shutdown(ctx context.Context) error {
	return g.front.shutdown(ctx)
}

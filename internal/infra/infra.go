// Package infra wires the infras this machine may launch on into one provisioner: the embedded
// local infra always, and the Kubernetes contexts of $FERRY_HOME/config.yaml (by default the
// kubeconfig's current context, when there is a kubeconfig). The controller launches through
// it, and the CLI plans through it for `serve up`'s optimizer table, `show-gpus` and `check`.
package infra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/internal/home"
	"github.com/ferryserve/ferry/launcher"
	"github.com/ferryserve/ferry/launcher/kubernetes"
	"github.com/ferryserve/ferry/launcher/local"
	"github.com/ferryserve/ferry/launcher/optimizer"
	"github.com/ferryserve/ferry/launcher/provision"
)

// offeringsTimeout bounds asking one cluster what it has, per plan.
const offeringsTimeout = 10 * time.Second

// Options configures Open.
type Options struct {
	// PathPrepend goes first on local replicas' PATH (the ferry binary's directory).
	PathPrepend []string
	// Supervisor is the ferry binary, for local replicas on a fixed port (local.Options).
	Supervisor string
	Logger     *zap.Logger
	// BlockFor overrides provision.DefaultBlockFor.
	BlockFor time.Duration
	// PreemptionCooldown is how long a job preempted on local by a replica is safe from
	// another preemption (0: local.DefaultPreemptionCooldown).
	PreemptionCooldown time.Duration
	// WindowLead is how long before a reservation's end its replicas are replaced (0:
	// launcher.DefaultWindowLead); the optimizer leaves windows shorter than it.
	WindowLead time.Duration
	// KubeQPS and KubeBurst rate-limit each Kubernetes context's clients (kubernetes.Options);
	// zeros take kubernetes.DefaultQPS and DefaultBurst.
	KubeQPS   float32
	KubeBurst int
}

// Set is the enabled infras and the provisioner over them.
type Set struct {
	Config *configs.FerryConfig
	Local  *local.Provider
	Kube   []*kubernetes.Provider
	// Problems are infras the config names that could not be set up (a context missing from
	// the kubeconfig): `ferry check` shows them; the rest work without them.
	Problems    map[string]error
	Provisioner *provision.Provisioner
	clouds      []cloud
	log         *zap.Logger
	windowLead  time.Duration
}

// Open reads the config and builds the providers. Nothing is contacted yet.
func Open(h home.Home, opts Options) (*Set, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	cfg, err := configs.LoadFerryConfig(ConfigPath(h))
	if err != nil {
		return nil, err
	}
	s := &Set{Config: cfg, Problems: map[string]error{}, log: opts.Logger, windowLead: cmp.Or(opts.WindowLead, launcher.DefaultWindowLead)}
	cpus, mem := s.localCapacity()
	s.Local, err = local.New(local.Options{Dir: h.LocalDir(), CPUs: cpus, MemoryGiB: mem, PathPrepend: opts.PathPrepend, Supervisor: opts.Supervisor,
		PrivateNetwork: opts.Supervisor != "", Logger: opts.Logger.Named("local"), Accelerators: s.localGPUs(),
		PreemptionCooldown: opts.PreemptionCooldown})
	if err != nil {
		return nil, err
	}
	infras := []provision.Infra{{Name: configs.InfraLocal, Provider: s.Local}}
	for _, kc := range kubeContexts(cfg.Kubernetes) {
		o := kubernetes.Options{Context: kc.Name, Namespace: kc.Namespace, CostPerHour: kc.CostPerHour, Logger: opts.Logger.Named("kubernetes"),
			QueuedProvisioning: kc.QueuedProvisioning, QPS: opts.KubeQPS, Burst: opts.KubeBurst}
		if k := cfg.Kubernetes; k != nil {
			o.Kubeconfig = k.Kubeconfig
			o.ProvisionTimeout = time.Duration(k.ProvisionTimeoutSeconds) * time.Second
			o.IngressPodLabels, o.IngressNamespace, o.IngressCIDRs = k.ProxyPodLabels, k.ProxyNamespace, k.ProxyCIDRs
			o.CheckpointSize, o.CheckpointStorageClass = k.CheckpointSize, k.CheckpointStorageClass
			o.GPUSchedulerName = k.GPUSchedulerName
			o.KueueLocalQueue = k.KueueLocalQueue
			o.ServingPriority, o.MaxPriority = int32Of(k.ServingPriority), int32Of(k.MaxPriority)
		}
		p, err := kubernetes.New(o)
		if err != nil {
			name := kubernetes.InfraName + "/" + kc.Name
			if kc.Name == "" {
				name = kubernetes.InfraName
			}
			s.Problems[name] = err
			continue
		}
		s.Kube = append(s.Kube, p)
		infras = append(infras, provision.Infra{Name: p.Infra(), Provider: p})
	}
	s.clouds = openClouds(cfg, s.windowLead, opts.Logger, s.Problems)
	for _, c := range s.clouds {
		infras = append(infras, provision.Infra{Name: c.name, Provider: c.provider})
	}
	health := provision.NewHealth(provision.HealthOptions{OnChange: func(st launcher.InfraState) { logHealth(opts.Logger, st) }})
	s.Provisioner, err = provision.New(provision.Options{
		Infras:   infras,
		Planner:  provision.PlannerFunc(s.plan),
		BlockFor: opts.BlockFor,
		Health:   health,
		Logger:   opts.Logger.Named("provision"),
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// logHealth says when an infra (or a zone of one) goes down, is throttled, or answers again:
// one line per change, not per failed call.
func logHealth(log *zap.Logger, st launcher.InfraState) {
	switch st.State {
	case launcher.InfraUp:
		log.Info("infra answers again", zap.String("infra", st.Where()))
	case launcher.InfraThrottled:
		log.Warn("infra throttles Ferry; backing off", zap.String("infra", st.Where()), zap.Time("retry_at", st.RetryAt), zap.String("error", st.LastError))
	default:
		log.Warn("infra down: skipped until a probe finds it answering", zap.String("infra", st.Where()), zap.Int("failures", st.Failures),
			zap.String("class", st.LastClass), zap.String("error", st.LastError))
	}
}

// ConfigPath is Ferry's settings file in h.
func ConfigPath(h home.Home) string { return filepath.Join(h.Dir, "config.yaml") }

// kubeContexts are the contexts to enable: the config's, or with none listed the kubeconfig's
// current context — but only when a kubeconfig exists, so a machine without Kubernetes does
// not report a problem it never asked about.
func kubeContexts(k *configs.KubernetesConfig) []configs.KubernetesContext {
	if k != nil && len(k.Contexts) > 0 {
		return k.Contexts
	}
	if k == nil && !kubeconfigExists() {
		return nil
	}
	return []configs.KubernetesContext{{}}
}

func kubeconfigExists() bool {
	for _, p := range clientcmd.NewDefaultClientConfigLoadingRules().Precedence {
		if _, err := os.Stat(p); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return true
		}
	}
	return false
}

// Close stops the Kubernetes watches and the clouds' clients.
func (s *Set) Close() {
	for _, k := range s.Kube {
		k.Close()
	}
	for _, c := range s.clouds {
		if cl, ok := c.provider.(interface{ Close() }); ok {
			cl.Close()
		}
	}
}

// Notifiers are the enabled infras that announce preemptions, by infra name.
func (s *Set) Notifiers() map[string]launcher.PreemptionNotifier {
	out := map[string]launcher.PreemptionNotifier{}
	for _, c := range s.clouds {
		if n, ok := c.provider.(launcher.PreemptionNotifier); ok {
			out[c.name] = n
		}
	}
	return out
}

// Clouds are the enabled clouds' providers, for `ferry check`.
func (s *Set) Clouds() []launcher.Provider {
	out := make([]launcher.Provider, len(s.clouds))
	for i, c := range s.clouds {
		out[i] = c.provider
	}
	return out
}

// Infras returns the optimizer's view of every enabled infra that r may use, asking each such
// Kubernetes cluster what it has, all at once, each within offeringsTimeout. A cluster that
// cannot answer is left with no offerings (and is therefore not a candidate); its error is
// returned alongside. An infra whose breaker is open (launcher/provision/health.go) is not
// asked and not planned: its DownError is returned as its error, and Down lists it.
func (s *Set) Infras(ctx context.Context, r configs.Resources) ([]optimizer.Infra, map[string]error) {
	out := []optimizer.Infra{{Name: configs.InfraLocal, Kind: optimizer.Local, Offerings: s.localOfferings()}}
	type ask struct {
		name string
		fn   func(context.Context) (optimizer.Infra, error)
	}
	var asks []ask
	for _, k := range s.Kube {
		asks = append(asks, ask{k.Infra(), func(ctx context.Context) (optimizer.Infra, error) {
			offers, err := k.Offerings(ctx)
			return optimizer.Infra{Name: k.Infra(), Kind: optimizer.Kubernetes, Offerings: offers}, err
		}})
	}
	for _, c := range s.clouds {
		asks = append(asks, ask{c.name, func(ctx context.Context) (optimizer.Infra, error) {
			return c.optimizerInfra(ctx, r) // on error: planned with AZ IDs; the provider resolves them at launch
		}})
	}
	asks = slices.DeleteFunc(asks, func(a ask) bool { return !usable(r, a.name) })
	infras := make([]optimizer.Infra, len(asks))
	errs := make([]error, len(asks))
	planned := make([]bool, len(asks))
	var wg sync.WaitGroup
	for i, a := range asks {
		if err := s.health().Allow(a.name, ""); err != nil {
			errs[i] = err
			continue
		}
		planned[i] = true
		wg.Go(func() {
			octx, cancel := context.WithTimeout(ctx, offeringsTimeout)
			defer cancel()
			infras[i], errs[i] = a.fn(octx)
			s.observe(ctx, octx, a.name, errs[i])
		})
	}
	wg.Wait()
	errMap := map[string]error{}
	for i, a := range asks {
		if planned[i] {
			out = append(out, infras[i])
		}
		if errs[i] != nil {
			errMap[a.name] = errs[i]
		}
	}
	return out, errMap
}

// health is the provisioner's breakers.
func (s *Set) health() *provision.Health { return s.Provisioner.Health() }

// observe feeds the infra failing, as asking it for the plan found, into its breaker (a
// question cut by its own deadline is its timeout). Successes are not counted: much of the plan
// is the catalog's, with no call at all, and must not read as the infra answering. Other
// errors of these optional questions (no permission to read spot prices, say) say nothing of
// whether the infra can launch and list.
func (s *Set) observe(parent, call context.Context, name string, err error) {
	if err == nil || parent.Err() != nil {
		return
	}
	if errors.Is(call.Err(), context.DeadlineExceeded) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: %w (%w)", launcher.ErrUnavailable, err, context.DeadlineExceeded)
	}
	// A partial answer (a region or zone that did not answer) is charged to those parts: one
	// zone that cannot list its reservations must not read as the whole infra failing.
	gaps, partial := launcher.Partial(err)
	if !partial {
		gaps = []launcher.Gap{{Err: err}}
	}
	for _, g := range gaps {
		switch provision.Class(g.Err) {
		case provision.ClassTimeout, provision.ClassUnavailable, provision.ClassThrottled:
			s.health().Observe(name, cmp.Or(g.Zone, g.Region), g.Err)
		}
	}
}

// Down are the enabled infras r may use whose breakers are open: the plan skips them, and the
// optimizer table says why.
func (s *Set) Down(r configs.Resources) []launcher.InfraState {
	var out []launcher.InfraState
	for _, st := range s.health().States() {
		if st.Zone == "" && st.State != launcher.InfraUp && usable(r, st.Infra) {
			out = append(out, st)
		}
	}
	return out
}

// AllInfras is Infras for every enabled infra, for `show-gpus` and `check`.
func (s *Set) AllInfras(ctx context.Context) ([]optimizer.Infra, map[string]error) {
	return s.Infras(ctx, configs.Resources{AnyOf: []configs.Resources{{Infra: "*"}, {Infra: configs.InfraLocal}}})
}

func usable(r configs.Resources, name string) bool {
	for _, c := range r.Candidates() {
		if provision.InfraMatches(c.Infra, name) {
			return true
		}
	}
	return false
}

// Plan runs the optimizer over the enabled infras.
func (s *Set) Plan(ctx context.Context, r configs.Resources) ([]optimizer.Candidate, error) {
	infras, errs := s.Infras(ctx, r)
	opts := optimizer.CapacityOptions{Now: time.Now()}
	if r.Capacity != nil && r.Capacity.NoQueue {
		// A service's replica is replaced windowLead before its window ends, so a shorter
		// window is no place for one. A job runs in a window until its end (or its
		// max_run_duration): no lead applies to it.
		opts.MinWindow = s.windowLead
	}
	cands, err := optimizer.PlanCapacity(r, infras, opts)
	if err == nil {
		cands = s.inRegions(cands)
		cands = optimizer.DemoteLowScoreRegions(cands, s.regionScores(ctx, r), len(r.Ordered) > 0)
	}
	if err != nil && len(errs) > 0 {
		// Say why a cluster that might have fit was not asked.
		return nil, fmt.Errorf("%w (and could not ask: %v)", err, errors.Join(mapErrs(errs)...))
	}
	if err == nil {
		for name, e := range errs {
			s.log.Warn("infra planned without what it could not tell (offerings, live prices or zone names)", zap.String("infra", name), zap.Error(e))
		}
	}
	return cands, err
}

// regionScores asks each cloud that can rate its regions for spot; a cloud that cannot answer
// is planned by price alone.
func (s *Set) regionScores(ctx context.Context, r configs.Resources) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, c := range s.clouds {
		if !usable(r, c.name) || s.health().Allow(c.name, "") != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, offeringsTimeout)
		scores, err := c.regionScores(sctx, r)
		s.observe(ctx, sctx, c.name, err)
		cancel()
		if err != nil {
			s.log.Warn("no spot placement scores; planning by price", zap.String("infra", c.name), zap.Error(err))
			continue
		}
		if scores != nil {
			out[c.name] = scores
		}
	}
	return out
}

func (s *Set) plan(ctx context.Context, r configs.Resources) ([]launcher.Placement, error) {
	cands, err := s.Plan(ctx, r)
	if err != nil {
		return nil, err
	}
	out := make([]launcher.Placement, len(cands))
	for i, c := range cands {
		out[i] = c.Placement
	}
	return out, nil
}

func mapErrs(m map[string]error) []error {
	var out []error
	for name, err := range m {
		out = append(out, fmt.Errorf("%s: %w", name, err))
	}
	return out
}

// int32Of is *v as an int32 (configs bounds priorities to the API's range), nil for nil.
func int32Of(v *int) *int32 {
	if v == nil {
		return nil
	}
	return new(int32(*v))
}

package kubestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ferryserve/ferry/internal/store"
)

// Labels and annotations on every object kubestore writes.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "ferry"
	// LabelKind marks the store's own objects, which nothing else of Ferry's carries: the
	// launcher labels its per-pod Secrets managed-by=ferry too, but they hold no fence, so the
	// chart's fencing policy selects on this label (charts/ferry/templates/fencing-policy.yaml).
	// Every object the store has ever written has it, so no upgrade relabels anything.
	LabelKind    = "ferry.dev/kind"
	LabelService = "ferry.dev/service"
	// AnnotationTerm and AnnotationHolder fence writes: the fencing policy admits a write only
	// when they are the Lease's spec.leaseTransitions and spec.holderIdentity.
	AnnotationTerm   = "ferry.dev/term"
	AnnotationHolder = "ferry.dev/holder"
	// AnnotationDeleting marks an object a delete is removing: writers leave it alone, so
	// that nothing changes it between the mark and the delete (see DeleteIf).
	AnnotationDeleting = "ferry.dev/deleting"
)

// ErrNotLeader is returned by every write while Options.Fence reports that this controller does
// not lead.
var ErrNotLeader = errors.New("kubestore: not the leader: refusing to write")

// Options configure Open.
type Options struct {
	Config    *rest.Config
	Namespace string
	// Fence reports the leader's term, ok false when this controller does not lead. Nil means
	// no leader election: writes carry no fence (and a namespace with the fencing policy
	// installed refuses them).
	Fence func() (term int64, ok bool)
	// Holder is this controller's identity in the Lease (--id), stamped beside the term.
	Holder string
}

// Store is a store.Store on the API server. Create with Open.
type Store struct {
	client kubernetes.Interface
	ns     string
	opts   Options
	cms    *written
	key    stateKey
	stop   context.CancelFunc
	// fenced: the API server enforces the fencing policy here (probeFence), so no other
	// controller's write lands beside this one's while it leads, and the store may trust its
	// own view where it would otherwise ask the API server again (createReplica).
	fenced   bool
	openTerm int64
	// reserved are replica ids this store reserved for services it created (ids.go).
	reserved reservedIDs
	// Test hooks, nil but in tests. stamped runs between a delete's stamp and the delete
	// itself: where another writer's change makes the delete's precondition fail. creating runs
	// before a replica's record is created, after its service was found not being deleted.
	stamped  func(name string)
	creating func(name string)
}

var _ store.Store = (*Store)(nil)

// maxRetries bounds the re-read-and-retry of a read-modify-write or a delete that meets
// conflicts: with pause's backoff, 20 retries wait less than 4 s in all.
const maxRetries = 20

// Open starts the informer of the namespace's Ferry ConfigMaps and returns once it has synced
// and the records from before sealing are sealed (see migrate). Secrets are read by name only:
// no informer lists or watches them.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Config == nil || opts.Namespace == "" {
		return nil, errors.New("kubestore: Config and Namespace are required")
	}
	client, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("kubestore: %w", err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = LabelManagedBy + "=" + ManagedBy }))
	cms := factory.Core().V1().ConfigMaps()
	cmInformer := cms.Informer()
	runCtx, stop := context.WithCancel(context.Background())
	factory.Start(runCtx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), cmInformer.HasSynced) {
		stop()
		factory.Shutdown()
		return nil, fmt.Errorf("kubestore: informer of namespace %s did not sync: %w", opts.Namespace, context.Cause(ctx))
	}
	s := &Store{client: client, ns: opts.Namespace, opts: opts,
		cms: newWritten(cms.Lister().ConfigMaps(opts.Namespace)), stop: func() { stop(); factory.Shutdown() },
		reserved: reservedIDs{svc: map[string]idBlock{}}}
	if err := s.migrate(ctx); err != nil {
		s.stop()
		return nil, err
	}
	if opts.Fence != nil {
		term, leads := opts.Fence()
		s.fenced, s.openTerm = leads && s.probeFence(ctx), term
	}
	return s, nil
}

// Fenced reports whether the API server enforces the chart's fencing policy on this store's
// writes, found when the store opened, as the leader.
func (s *Store) Fenced() bool { return s.fenced }

// trustsOwnView reports whether no other controller's write can land beside this store's: it is
// fenced, and still leads in the term it opened in. The store opened after its controller took
// the Lease, so its view holds every write of the terms before, and from then on the API server
// refuses every other controller's writes (a write admitted just before the Lease changed hands
// and stored just after is the exception: it reaches the view through the watch).
func (s *Store) trustsOwnView() bool {
	if !s.fenced {
		return false
	}
	term, leads := s.opts.Fence()
	return leads && term == s.openTerm
}

// fenceProbe is the name of the object probeFence offers the API server; nothing is stored.
const fenceProbe = "ferry-fence-probe"

// probeBudget bounds probeFence as a whole: an API server that errs or hangs on the dry run
// delays a new leader by this much at most, and the store then assumes no fence.
var probeBudget = 10 * time.Second

// probeFence reports whether the fencing policy guards the namespace: a dry run of a store
// object's create, stamped with a term and holder that no Lease has, must be refused by it (its
// message names the term annotation). Without leader election, or when the dry run is admitted,
// the store assumes no fence, which is always safe: it only costs API calls. Any other answer (a
// refusal for another reason, an error) is asked again within probeBudget: the first leader ever
// probes right after creating the Lease, which the policy may not see yet ("no params found").
func (s *Store) probeFence(ctx context.Context) bool {
	if s.opts.Fence == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, probeBudget)
	defer cancel()
	cm := &corev1.ConfigMap{ObjectMeta: objectMeta(fenceProbe, "probe", "")}
	cm.Annotations = map[string]string{AnnotationTerm: "-1", AnnotationHolder: fenceProbe}
	for {
		_, err := s.client.CoreV1().ConfigMaps(s.ns).Create(ctx, cm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused := apierrors.IsForbidden(err) || apierrors.IsInvalid(err)
		switch {
		case err == nil:
			return false
		case refused && strings.Contains(err.Error(), AnnotationTerm):
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Close stops the informers.
func (s *Store) Close() error {
	s.stop()
	return nil
}

// ctx is the context of one store call: the store.Store interface has none, so calls are bounded
// here instead.
func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}

// objectMeta is the metadata of a new object of kind.
func objectMeta(name, kind, service string) metav1.ObjectMeta {
	l := map[string]string{LabelManagedBy: ManagedBy, LabelKind: kind}
	if service != "" {
		l[LabelService] = service
	}
	return metav1.ObjectMeta{Name: name, Labels: l}
}

// nameRE is what a service name must be to name objects (configs' rule for names).
var nameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)

func checkName(service string) error {
	if len(service) > 200 || !nameRE.MatchString(service) {
		return fmt.Errorf("kubestore: service name %q: want lower-case letters, digits and '-', starting with a letter", service)
	}
	return nil
}

// kindSelector selects the objects of one kind (and service, when not empty).
func kindSelector(kind, service string) labels.Selector {
	set := labels.Set{LabelManagedBy: ManagedBy, LabelKind: kind}
	if service != "" {
		set[LabelService] = service
	}
	return labels.SelectorFromSet(set)
}

// wrapNotFound turns the API's NotFound into store.ErrNotFound.
func wrapNotFound(err error, what string) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	return err
}

// newerOrSame reports whether resourceVersion have is at least want. Resource versions are
// etcd revisions; the API asks clients not to compare them, but the cache's only other
// promise, equality, cannot tell a newer write apart from a lost one.
func newerOrSame(have, want string) bool {
	h, err1 := strconv.ParseUint(have, 10, 64)
	w, err2 := strconv.ParseUint(want, 10, 64)
	if err1 != nil || err2 != nil {
		return have == want
	}
	return h >= w
}

// olderThan reports whether resourceVersion a is older than b. Unlike newerOrSame it is false
// where either is not a number: the overlay then takes the later answer as it comes.
func olderThan(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x < y
}

// objects is one kind of object as the write helpers need it.
type objects[T metav1.Object] struct {
	s        *Store
	cached   func(name string) (T, error)
	get      func(ctx context.Context, name string) (T, error)
	create   func(ctx context.Context, obj T) (T, error)
	update   func(ctx context.Context, obj T) (T, error)
	patch    func(ctx context.Context, name string, mergePatch []byte) (T, error)
	del      func(ctx context.Context, name string, opts metav1.DeleteOptions) error
	deepCopy func(T) T
	// learn and deleted lay what the API server just answered (an object written or read
	// fresh, an object deleted) over the cache (written.go).
	learn   func(T)
	deleted func(name, rv string)
}

func (s *Store) configMaps() objects[*corev1.ConfigMap] {
	c := s.client.CoreV1().ConfigMaps(s.ns)
	return objects[*corev1.ConfigMap]{s: s, cached: s.cms.Get,
		get: func(ctx context.Context, name string) (*corev1.ConfigMap, error) {
			return c.Get(ctx, name, metav1.GetOptions{})
		},
		create: func(ctx context.Context, o *corev1.ConfigMap) (*corev1.ConfigMap, error) {
			return c.Create(ctx, o, metav1.CreateOptions{})
		},
		update: func(ctx context.Context, o *corev1.ConfigMap) (*corev1.ConfigMap, error) {
			return c.Update(ctx, o, metav1.UpdateOptions{})
		},
		patch: func(ctx context.Context, name string, p []byte) (*corev1.ConfigMap, error) {
			return c.Patch(ctx, name, types.MergePatchType, p, metav1.PatchOptions{})
		},
		del: c.Delete, deepCopy: (*corev1.ConfigMap).DeepCopy, learn: s.cms.learn, deleted: s.cms.deleted}
}

// gone lays over the cache that the named object is gone, as the API server just said.
func (o objects[T]) gone(name string) {
	if cur, err := o.cached(name); err == nil {
		o.deleted(name, cur.GetResourceVersion())
	}
}

// Create creates obj, fenced; the store reads it from then on.
func (o objects[T]) Create(obj T) (T, error) {
	var zero T
	if err := o.s.fenceObject(obj); err != nil {
		return zero, err
	}
	ctx, cancel := o.s.ctx()
	defer cancel()
	out, err := o.create(ctx, obj)
	if err != nil {
		return zero, err
	}
	o.learn(out)
	return out, nil
}

// Update is a read-modify-write of the named object: mutate changes a copy of the object, which
// is sent with its resourceVersion; on a conflict the object is read again from the API server
// and mutate runs again on it, after a jittered pause, at most maxRetries times. Every attempt is
// fenced anew, so a controller that stopped leading meanwhile stops there. A mutate error ends
// it as is. The caller reads its own write from then on.
func (o objects[T]) Update(name string, mutate func(T) error) (T, error) {
	ctx, cancel := o.s.ctx()
	defer cancel()
	return o.write(ctx, name, false, mutate)
}

// read is the named object from the cache or, when fresh or when the cache does not have it,
// from the API server: an object another controller created a moment ago may not be in this
// one's cache yet, and "not found" must be the API server's answer, not a lagging cache's.
func (o objects[T]) read(ctx context.Context, name string, fresh bool) (T, error) {
	if !fresh {
		cur, err := o.cached(name)
		if !apierrors.IsNotFound(err) {
			return cur, err
		}
	}
	return o.fetch(ctx, name)
}

// fetch reads the named object from the API server, and the store reads it so from then on.
func (o objects[T]) fetch(ctx context.Context, name string) (T, error) {
	cur, err := o.get(ctx, name)
	if err == nil {
		o.learn(cur)
	}
	return cur, err
}

// write is Update; fresh skips the cache for the first read.
func (o objects[T]) write(ctx context.Context, name string, fresh bool, mutate func(T) error) (T, error) {
	var zero T
	cur, err := o.read(ctx, name, fresh)
	for attempt := 0; ; attempt++ {
		if err == nil && marked(cur) {
			err = errMarked(name)
		}
		if err != nil {
			return zero, err
		}
		obj := o.deepCopy(cur)
		if err := mutate(obj); err != nil {
			return zero, err
		}
		if err := o.s.fenceObject(obj); err != nil {
			return zero, err
		}
		out, uerr := o.update(ctx, obj)
		if uerr == nil {
			o.learn(out)
			return out, nil
		}
		if !apierrors.IsConflict(uerr) {
			return zero, uerr
		}
		if attempt == maxRetries {
			return zero, fmt.Errorf("kubestore: update %s: still conflicting after %d fresh reads: %w", name, maxRetries, uerr)
		}
		if err := pause(ctx, attempt); err != nil {
			return zero, err
		}
		cur, err = o.fetch(ctx, name)
	}
}

// Delete stamps the fence on the named object (a write the policy checks) and deletes it on the
// condition that nothing changed since. Gone already is success.
func (o objects[T]) Delete(name string) error {
	return o.DeleteIf(name, func(T) error { return nil })
}

// DeleteIf is Delete of an object that check accepts. The object is marked first
// (AnnotationDeleting, with the fence: a write the policy checks) by a merge patch, which
// applies to whatever the object is by then and so cannot be refused for a conflict: a delete
// is never starved by writers that keep changing the object. From the mark on, writers leave
// the object alone (Update refuses it as gone), so the delete, conditional on the mark's
// resourceVersion, succeeds unless someone outside Ferry wrote meanwhile; then the object is
// read again from the API server and marked and deleted again, bounded as Update is. check
// runs on the object read before the mark and again on the marked one (a failure then takes
// the mark off); its error ends it as is. Gone already, or gone meanwhile, is success.
func (o objects[T]) DeleteIf(name string, check func(T) error) error {
	ctx, cancel := o.s.ctx()
	defer cancel()
	for attempt := 0; ; attempt++ {
		cur, err := o.read(ctx, name, attempt > 0)
		if err == nil {
			err = check(cur)
		}
		var done T
		if err == nil {
			done, err = o.mark(ctx, name, true)
		}
		if err == nil {
			if err = check(done); err != nil {
				_, _ = o.mark(ctx, name, false)
			}
		}
		if apierrors.IsNotFound(err) {
			o.gone(name)
			return nil
		}
		if err != nil {
			return err
		}
		if o.s.stamped != nil {
			o.s.stamped(name)
		}
		rv := done.GetResourceVersion()
		err = o.del(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		if err == nil {
			o.deleted(name, rv)
			return nil
		}
		if apierrors.IsNotFound(err) {
			o.gone(name)
			return nil
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		if attempt == maxRetries {
			return fmt.Errorf("kubestore: delete %s: still changed under the delete after %d fresh reads: %w", name, maxRetries, err)
		}
		if err := pause(ctx, attempt); err != nil {
			return err
		}
	}
}

// mark sets (or, !on, removes) AnnotationDeleting on the named object with a merge patch that
// carries the fence.
func (o objects[T]) mark(ctx context.Context, name string, on bool) (T, error) {
	var zero T
	a, err := o.s.fence()
	if err != nil {
		return zero, err
	}
	annotations := map[string]any{}
	for k, v := range a {
		annotations[k] = v
	}
	annotations[AnnotationDeleting] = nil
	if on {
		annotations[AnnotationDeleting] = "true"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return zero, err
	}
	out, err := o.patch(ctx, name, patch)
	if err == nil {
		o.learn(out)
	}
	return out, err
}

// marked reports whether a delete is removing obj.
func marked(obj metav1.Object) bool { return obj.GetAnnotations()[AnnotationDeleting] != "" }

// errMarked is what a write to an object being deleted gets: not found (it is as good as
// gone), and errBeingDeleted.
func errMarked(name string) error {
	return fmt.Errorf("kubestore: %s: %w (%w)", name, apierrors.NewNotFound(schema.GroupResource{}, name), errBeingDeleted)
}

// Backoff of a write that met a conflict: exponential from backoffBase, at most backoffCap.
const (
	backoffBase = 4 * time.Millisecond
	backoffCap  = 250 * time.Millisecond
)

// pause waits before retry attempt+1 of a write that met a conflict: a random time between half
// and all of the exponential backoff, so that writers that collided (many goroutines, two
// controllers across a failover) do not collide again in step. The jitter needs no seed: it
// decides nothing but when to try again.
func pause(ctx context.Context, attempt int) error {
	d := min(backoffBase<<min(attempt, 16), backoffCap)
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// fence is the annotations that fence a write, none without leader election; it refuses when
// not leading.
func (s *Store) fence() (map[string]string, error) {
	if s.opts.Fence == nil {
		return nil, nil
	}
	term, ok := s.opts.Fence()
	if !ok {
		return nil, ErrNotLeader
	}
	return map[string]string{AnnotationTerm: strconv.FormatInt(term, 10), AnnotationHolder: s.opts.Holder}, nil
}

// fenceObject stamps obj's metadata with the leader's term and holder, or refuses when not
// leading.
func (s *Store) fenceObject(obj metav1.Object) error {
	f, err := s.fence()
	if err != nil || f == nil {
		return err
	}
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	maps.Copy(a, f)
	obj.SetAnnotations(a)
	return nil
}

func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

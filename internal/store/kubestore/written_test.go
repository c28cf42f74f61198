package kubestore

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// TestWrittenLaysOwnWritesOverTheCache checks the overlay against a cache the test moves by
// hand, as the watch would, late.
func TestWrittenLaysOwnWritesOverTheCache(t *testing.T) {
	const ns = "ferry"
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	w := newWritten(listerscorev1.NewConfigMapLister(indexer).ConfigMaps(ns))
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	w.now = func() time.Time { return now }
	cm := func(name, rv, kind, note string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: rv,
			Labels: map[string]string{LabelKind: kind}}, Data: map[string]string{"note": note}}
	}
	watch := func(objs ...*corev1.ConfigMap) { // the watch delivers
		for _, o := range objs {
			if err := indexer.Update(o); err != nil {
				t.Fatal(err)
			}
		}
	}
	unwatch := func(name string) {
		if err := indexer.Delete(cm(name, "", "", "")); err != nil {
			t.Fatal(err)
		}
	}
	get := func(name string) string {
		t.Helper()
		got, err := w.Get(name)
		if apierrors.IsNotFound(err) {
			return "not found"
		}
		if err != nil {
			t.Fatal(err)
		}
		return got.Data["note"]
	}
	list := func(kind string) string {
		t.Helper()
		items, err := w.List(labels.SelectorFromSet(labels.Set{LabelKind: kind}))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, i := range items {
			names = append(names, i.Name+"="+i.Data["note"])
		}
		slices.Sort(names)
		return strings.Join(names, ",")
	}
	check := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}

	watch(cm("a", "10", "replica", "a v10"))
	w.learn(cm("a", "12", "replica", "a v12"))           // an update the watch has not delivered
	w.learn(cm("b", "13", "replica", "b v13"))           // a create the watch has not delivered
	w.learn(cm("a", "11", "replica", "a v11 read late")) // an older answer arriving last is ignored
	check("updated, unwatched", get("a"), "a v12")
	check("created, unwatched", get("b"), "b v13")
	check("list", list("replica"), "a=a v12,b=b v13")
	check("another kind", list("job"), "")

	watch(cm("a", "12", "replica", "a v12 watched"))
	check("caught up", get("a"), "a v12 watched")
	watch(cm("a", "15", "replica", "a v15 by another"))
	check("a later write by another", get("a"), "a v15 by another")

	// A relabelled object leaves a list at once.
	w.learn(cm("b", "16", "job", "b v16"))
	check("relabelled: old kind", list("replica"), "a=a v15 by another")
	check("relabelled: new kind", list("job"), "b=b v16")

	// A delete: gone at once, while the watch still shows it; made again later by someone.
	w.deleted("a", "15")
	check("deleted, still watched", get("a"), "not found")
	check("deleted: list", list("replica"), "")
	watch(cm("a", "20", "replica", "a made again"))
	check("made again", get("a"), "a made again")
	w.deleted("a", "20")
	unwatch("a")
	check("deleted and watched", get("a"), "not found")

	// A create the watch never shows (deleted by someone else at once) is believed gone after
	// a while; one it shows late is kept until then.
	w.learn(cm("c", "30", "replica", "c v30"))
	now = now.Add(unseenCreateTTL / 2)
	check("created, unwatched a while", get("c"), "c v30")
	now = now.Add(unseenCreateTTL)
	check("created, never watched", get("c"), "not found")

	// Entries the watch caught up with are swept, read or not.
	w.learn(cm("d", "40", "replica", "d v40"))
	watch(cm("d", "40", "replica", "d v40"))
	now = now.Add(2 * sweepEvery)
	w.learn(cm("e", "41", "replica", "e v41"))
	w.mu.Lock()
	_, kept := w.own["d"]
	w.mu.Unlock()
	if kept {
		t.Error("an entry the watch caught up with was kept past a sweep")
	}
}

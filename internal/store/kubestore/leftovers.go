package kubestore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ferryserve/ferry/launcher"
)

const (
	kindLeftover = "leftover"
	keyLeftover  = "leftover.json"
)

var _ launcher.Ledger = (*Store)(nil)

// leftoverObject names the ConfigMap of the leftover with key. Keys hold '/', '|', '=' and ','
// and can be long, none of which an object name may, so the name is a short hash of the key;
// the key itself is in the record, and a record under the name that holds another key (a hash
// collision, or a hand-edited object) is never overwritten or deleted in its place.
func leftoverObject(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "ferry-left-" + hex.EncodeToString(sum[:8])
}

// errOtherLeftover is a leftover's ConfigMap that holds another key.
var errOtherLeftover = errors.New("holds another leftover")

// checkLeftoverKey accepts cm when it holds the leftover with key, or none yet.
func checkLeftoverKey(cm *corev1.ConfigMap, key string) error {
	var held launcher.Leftover
	ok, err := getJSON(cm, keyLeftover, &held)
	if err != nil {
		return err
	}
	if ok && held.Key != key {
		return fmt.Errorf("kubestore: ConfigMap %s %w (%q), not %q", cm.Name, errOtherLeftover, held.Key, key)
	}
	return nil
}

// PutLeftover implements launcher.Ledger: the leftover's ConfigMap is created, or replaced whole.
func (s *Store) PutLeftover(l launcher.Leftover) error {
	if l.Key == "" {
		return fmt.Errorf("put leftover %s: kubestore: a leftover needs a key", l.Describe())
	}
	l.Before, l.Since = l.Before.UTC(), l.Since.UTC()
	name := leftoverObject(l.Key)
	objs := s.configMaps()
	replace := func(cm *corev1.ConfigMap) error {
		if err := checkLeftoverKey(cm, l.Key); err != nil {
			return err
		}
		return putJSON(cm, keyLeftover, l)
	}
	_, err := objs.Update(name, replace)
	if apierrors.IsNotFound(err) {
		cm := &corev1.ConfigMap{ObjectMeta: objectMeta(name, kindLeftover, "")}
		if err := putJSON(cm, keyLeftover, l); err != nil {
			return err
		}
		_, err = objs.Create(cm)
		if apierrors.IsAlreadyExists(err) { // put meanwhile by another writer: replace it
			_, err = objs.Update(name, replace)
		}
	}
	if err != nil {
		return fmt.Errorf("put leftover %q: %w", l.Key, err)
	}
	return nil
}

// DeleteLeftover implements launcher.Ledger; an unknown key is not an error.
func (s *Store) DeleteLeftover(key string) error {
	err := s.configMaps().DeleteIf(leftoverObject(key), func(cm *corev1.ConfigMap) error { return checkLeftoverKey(cm, key) })
	if errors.Is(err, errOtherLeftover) {
		return nil // the name's record is another key's: this key has none
	}
	if err != nil {
		return fmt.Errorf("delete leftover %q: %w", key, err)
	}
	return nil
}

// ListLeftovers implements launcher.Ledger, ordered by key.
func (s *Store) ListLeftovers() ([]launcher.Leftover, error) {
	cms, err := s.cms.List(kindSelector(kindLeftover, ""))
	if err != nil {
		return nil, fmt.Errorf("list leftovers: %w", err)
	}
	out := make([]launcher.Leftover, 0, len(cms))
	for _, cm := range cms {
		var l launcher.Leftover
		ok, err := getJSON(cm, keyLeftover, &l)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("kubestore: ConfigMap %s has no %s", cm.Name, keyLeftover)
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b launcher.Leftover) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

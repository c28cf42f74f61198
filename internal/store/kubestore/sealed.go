package kubestore

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A record's secret values (the full tasks: secrets, envs named like a credential, API key
// hashes) are kept in a ConfigMap of their own beside the record's, NAME.sealed, each value
// sealed: AES-256-GCM under the state key, with a fresh random nonce, bound to its object and
// key (a sealed task cannot be moved to another record or version). The key is the one Secret
// the state needs, KeySecret, read by name: so the chart's Role grants get on that name only,
// and no list or watch on Secrets (RBAC cannot narrow a list to Ferry's Secrets, so an
// informer on them could read every Secret of the namespace). Reading the ConfigMaps gives
// ciphertext; reading the keys takes the key too.
//
// Stores written before kept the values in a Secret per record (same name as the record's
// ConfigMap, no suffix). Open moves them into sealed ConfigMaps and deletes them, when it may
// write (it leads); until then reads fall back to those Secrets, by name.
const (
	// KeySecret is the Secret holding the state key, in the state's namespace.
	KeySecret = "ferry-state-key"
	// keySecretData is the key's entry in KeySecret: 32 random bytes.
	keySecretData = "key"
	sealedSuffix  = ".sealed" // service names hold no dot, so no record is named like this
	sealedKind    = "sealed"
	// migrateHint says what to do when the Secrets of a store written before may not be read.
	migrateHint = "give the controller get and delete on the namespace's Secrets for one start (helm upgrade --set controller.migrateStateSecrets=true), which moves them into sealed ConfigMaps, then take it away (--set controller.migrateStateSecrets=false)"
)

// ErrStateKey is returned (wrapped) when the state key is missing while records are sealed with
// it, or is not the key they were sealed with.
var ErrStateKey = errors.New("kubestore: state key")

// sealedObject is the ConfigMap holding the sealed values of the record named name.
func sealedObject(name string) string { return name + sealedSuffix }

// stateKey loads the state key once: the Secret KeySecret read by name; create makes it when
// missing (a write, fenced: only the leader creates it, before its first sealed write).
type stateKey struct {
	mu   sync.Mutex
	aead cipher.AEAD
}

// sealer returns the state key's AEAD, loading it, or when create creating it, the first time.
// Without create, a missing key is nil, nil: no record is sealed yet.
func (s *Store) sealer(create bool) (cipher.AEAD, error) {
	s.key.mu.Lock()
	defer s.key.mu.Unlock()
	if s.key.aead != nil {
		return s.key.aead, nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	secrets := s.client.CoreV1().Secrets(s.ns)
	sec, err := secrets.Get(ctx, KeySecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && create {
		sec, err = s.createKey(ctx)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read Secret %s: %w", ErrStateKey, KeySecret, err)
	}
	key := sec.Data[keySecretData]
	if len(key) != 32 {
		return nil, fmt.Errorf("%w: Secret %s has no 32-byte %q entry", ErrStateKey, KeySecret, keySecretData)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStateKey, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStateKey, err)
	}
	s.key.aead = aead
	return aead, nil
}

// createKey creates KeySecret with a new random key, unless records are sealed already (their
// key was deleted: a new one cannot read them) or another controller created it first (then it
// is read).
func (s *Store) createKey(ctx context.Context) (*corev1.Secret, error) {
	if sealed, err := s.cms.List(kindSelector(sealedKind, "")); err == nil && len(sealed) > 0 {
		return nil, fmt.Errorf("%w: Secret %s is missing, but %d records are sealed with the key it held: restore it from a backup (a new key cannot read them)", ErrStateKey, KeySecret, len(sealed))
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // it never returns an error (Go 1.24)
	sec := &corev1.Secret{ObjectMeta: objectMeta(KeySecret, "key", ""), Type: corev1.SecretTypeOpaque, Data: map[string][]byte{keySecretData: key}}
	if err := s.fenceObject(sec); err != nil {
		return nil, err
	}
	secrets := s.client.CoreV1().Secrets(s.ns)
	out, err := secrets.Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return secrets.Get(ctx, KeySecret, metav1.GetOptions{})
	}
	return out, err
}

// seal encrypts plain, bound to the object and key it is stored under.
func seal(aead cipher.AEAD, object, key string, plain []byte) string {
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(plain)+aead.Overhead())
	_, _ = rand.Read(nonce) // it never returns an error (Go 1.24)
	return base64.StdEncoding.EncodeToString(aead.Seal(nonce, nonce, plain, []byte(object+"\x00"+key)))
}

// unseal decrypts what seal made for object and key.
func unseal(aead cipher.AEAD, object, key, sealed string) ([]byte, error) {
	raw, err := base64.StdEncoding.DecodeString(sealed)
	if err != nil || len(raw) < aead.NonceSize() {
		return nil, fmt.Errorf("%w: %s %s is damaged", ErrStateKey, object, key)
	}
	plain, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], []byte(object+"\x00"+key))
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s cannot be decrypted with the key in Secret %s: it is not the key the state was sealed with (restore that Secret)", ErrStateKey, object, key, KeySecret)
	}
	return plain, nil
}

// putSecret writes keys (JSON-encoded, sealed) into the sealed ConfigMap of the record named
// name, creating it when missing; reset drops the keys it had. A record from before sealing
// has its Secret's keys moved in first.
func (s *Store) putSecret(name, service string, reset bool, keys map[string]any) error {
	ctx, cancel := s.ctx()
	defer cancel()
	aead, err := s.sealer(true)
	if err != nil {
		return err
	}
	obj := sealedObject(name)
	data, mutate, err := sealedKeys(aead, obj, reset, keys)
	if err != nil {
		return err
	}
	objs := s.configMaps()
	_, err = objs.Update(obj, mutate)
	if !apierrors.IsNotFound(err) {
		return err
	}
	if !reset {
		if err := s.migrateRecord(ctx, name); err == nil {
			_, err = objs.Update(obj, mutate)
			return err
		} else if !apierrors.IsNotFound(err) {
			return err
		}
	}
	_, err = objs.Create(&corev1.ConfigMap{ObjectMeta: objectMeta(obj, sealedKind, service), Data: data})
	if apierrors.IsAlreadyExists(err) { // created meanwhile: merge into it
		_, err = objs.Update(obj, mutate)
	}
	return err
}

// updateSecret writes keys into the sealed ConfigMap of the record named name, which must exist
// (or the record's Secret from before sealing, which it replaces): a write to a record being
// deleted must not bring its secrets back.
func (s *Store) updateSecret(name string, keys map[string]any) error {
	ctx, cancel := s.ctx()
	defer cancel()
	aead, err := s.sealer(true)
	if err != nil {
		return err
	}
	obj := sealedObject(name)
	_, mutate, err := sealedKeys(aead, obj, false, keys)
	if err != nil {
		return err
	}
	_, err = s.configMaps().Update(obj, mutate)
	if apierrors.IsNotFound(err) && !errors.Is(err, errBeingDeleted) {
		if err := s.migrateRecord(ctx, name); err != nil {
			return err
		}
		_, err = s.configMaps().Update(obj, mutate)
	}
	return err
}

// sealedKeys encodes and seals keys for object, and returns the mutation that writes them into
// its ConfigMap (dropping the keys it had when reset).
func sealedKeys(aead cipher.AEAD, object string, reset bool, keys map[string]any) (map[string]string, func(*corev1.ConfigMap) error, error) {
	data := map[string]string{}
	for k, v := range keys {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, nil, err
		}
		data[k] = seal(aead, object, k, b)
	}
	return data, func(cm *corev1.ConfigMap) error {
		if reset || cm.Data == nil {
			cm.Data = map[string]string{}
		}
		for k, v := range data {
			cm.Data[k] = v
		}
		return nil
	}, nil
}

// secretJSON decodes key of the sealed values of the record named name into v; a missing key
// is an error, since the record that names it would otherwise be read with redacted values. A
// record from before sealing is read from its Secret.
func (s *Store) secretJSON(name, key string, v any) error {
	obj := sealedObject(name)
	cm, err := s.cms.Get(obj)
	if apierrors.IsNotFound(err) { // the API server's word, not a lagging cache's
		ctx, cancel := s.ctx()
		defer cancel()
		if cm, err = s.configMaps().get(ctx, obj); apierrors.IsNotFound(err) {
			return s.legacyJSON(ctx, name, key, v)
		}
	}
	if err != nil {
		return fmt.Errorf("kubestore: %s: %w", obj, err)
	}
	sealed, ok := cm.Data[key]
	if !ok {
		return fmt.Errorf("kubestore: %s has no %s", obj, key)
	}
	aead, err := s.sealer(false)
	if err == nil && aead == nil {
		err = fmt.Errorf("%w: Secret %s is missing, but %s is sealed with the key it held: restore it from a backup", ErrStateKey, KeySecret, obj)
	}
	if err != nil {
		return err
	}
	plain, err := unseal(aead, obj, key, sealed)
	if err != nil {
		return err
	}
	return json.Unmarshal(plain, v)
}

// legacyJSON is secretJSON of a record whose values are still in its Secret from before
// sealing.
func (s *Store) legacyJSON(ctx context.Context, name, key string, v any) error {
	sec, err := s.legacySecret(ctx, name)
	if err != nil {
		return err
	}
	b, ok := sec.Data[key]
	if !ok {
		return fmt.Errorf("kubestore: secret %s has no %s", name, key)
	}
	return json.Unmarshal(b, v)
}

// legacySecret is the Secret of the record named name from before sealing, by name.
func (s *Store) legacySecret(ctx context.Context, name string) (*corev1.Secret, error) {
	sec, err := s.client.CoreV1().Secrets(s.ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("kubestore: record %s keeps its secrets in the Secret of that name, from a Ferry that did not seal them, and this controller may not read it: %s: %w", name, migrateHint, err)
	}
	if err != nil {
		return nil, fmt.Errorf("kubestore: secret %s: %w", name, err)
	}
	return sec, nil
}

// migrateRecord moves the Secret of the record named name, from before sealing, into its
// sealed ConfigMap, and deletes the Secret. No Secret is NotFound.
func (s *Store) migrateRecord(ctx context.Context, name string) error {
	sec, err := s.legacySecret(ctx, name)
	if err != nil {
		return err
	}
	aead, err := s.sealer(true)
	if err != nil {
		return err
	}
	obj := sealedObject(name)
	data := map[string]string{}
	for k, v := range sec.Data {
		data[k] = seal(aead, obj, k, v)
	}
	if _, err := s.configMaps().Create(&corev1.ConfigMap{ObjectMeta: objectMeta(obj, sealedKind, sec.Labels[LabelService]), Data: data}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("kubestore: seal the secrets of %s: %w", name, err)
	}
	// The fencing policy does not cover deletes; the values are in the sealed ConfigMap now.
	if err := s.client.CoreV1().Secrets(s.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubestore: delete Secret %s, whose values are sealed in %s now: %w", name, obj, err)
	}
	return nil
}

// migrate moves every record's Secret from before sealing into its sealed ConfigMap, when this
// controller may write (it leads, or there is no election); a follower leaves them to the
// leader and reads them from the Secrets meanwhile. Either way every such Secret must be
// readable: one that is not is an error that says what to grant.
func (s *Store) migrate(ctx context.Context) error {
	var pending []string
	for _, kind := range []string{"service", "job"} {
		cms, err := s.cms.List(kindSelector(kind, ""))
		if err != nil {
			return err
		}
		for _, cm := range cms {
			if _, err := s.cms.Get(sealedObject(cm.Name)); apierrors.IsNotFound(err) && !marked(cm) {
				pending = append(pending, cm.Name)
			}
		}
	}
	if len(pending) == 0 {
		return nil
	}
	_, notLeading := s.fence()
	var forbidden []string
	for _, name := range pending {
		var err error
		if notLeading == nil {
			err = s.migrateRecord(ctx, name)
		} else {
			_, err = s.legacySecret(ctx, name)
		}
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err):
			forbidden = append(forbidden, name)
		default:
			return err
		}
	}
	if len(forbidden) > 0 {
		return fmt.Errorf("kubestore: %d records keep their secrets in Secrets of their names (%s), from a Ferry that did not seal them, and this controller may not read them: %s", len(forbidden), strings.Join(forbidden, ", "), migrateHint)
	}
	return nil
}

// deleteSecrets deletes the sealed values of the record named name, and its Secret from before
// sealing when it has no sealed ConfigMap (a record not migrated yet). A controller that may
// not delete Secrets has none from before (it could not have read them, and Open refuses
// that), so forbidden is nothing to delete.
func (s *Store) deleteSecrets(name string) error {
	obj := sealedObject(name)
	if _, err := s.cms.Get(obj); apierrors.IsNotFound(err) {
		ctx, cancel := s.ctx()
		defer cancel()
		err := s.client.CoreV1().Secrets(s.ns).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return fmt.Errorf("kubestore: delete Secret %s: %w", name, err)
		}
	}
	return s.configMaps().Delete(obj)
}

package kubestore

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ferryserve/ferry/internal/store"
	"github.com/ferryserve/ferry/tenants"
)

// The tenants' directory is one ConfigMap, ferry-tenants (kind tenants), its version checked on
// every write as SQLite checks it in a transaction. It holds key hashes, never secrets: a hash
// of a 238-bit random secret says nothing of it, so it needs no sealing. A key takes about 400
// bytes of JSON, so the 1 MiB object limit holds a couple of thousand keys.
//
// Usage is ConfigMaps per UTC day and shard, ferry-usage-2026-11-01-3 (kind usage, labelled
// with its day): a key's rows of a day go to shard hash(key id) mod usageShards, so that a day
// of many keys stays far below the object limit (a row is about 200 bytes: some 5,000 rows per
// shard, 40,000 a day) and writers of different keys rarely meet. Each shard is added to by a
// read-modify-write retried on conflict; rows of several shards are several writes, and a
// failure part-way names the rows not written (store.UnsavedUsageError).

const (
	tenantsObject = "ferry-tenants"
	kindTenants   = "tenants"
	keyDirectory  = "directory.json"

	kindUsage   = "usage"
	keyRows     = "rows.json"
	labelDay    = "ferry.dev/day"
	usageShards = 8
)

var _ store.TenantStore = (*Store)(nil)

// Tenants implements store.TenantStore.
func (s *Store) Tenants() (tenants.Directory, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var d tenants.Directory
	cm, err := s.configMaps().read(ctx, tenantsObject, false)
	if apierrors.IsNotFound(err) {
		return d, nil
	}
	if err != nil {
		return d, fmt.Errorf("read tenants: %w", err)
	}
	if _, err := getJSON(cm, keyDirectory, &d); err != nil {
		return tenants.Directory{}, fmt.Errorf("read tenants: %w", err)
	}
	return d, nil
}

// PutTenants implements store.TenantStore: the first version creates the ConfigMap, every later
// one updates it after checking the version it holds.
func (s *Store) PutTenants(d tenants.Directory) error {
	objs := s.configMaps()
	replace := func(cm *corev1.ConfigMap) error {
		var stored tenants.Directory
		if _, err := getJSON(cm, keyDirectory, &stored); err != nil {
			return err
		}
		if err := store.CheckTenantsVersion(d, stored.Version); err != nil {
			return err
		}
		return putJSON(cm, keyDirectory, d)
	}
	_, err := objs.Update(tenantsObject, replace)
	if apierrors.IsNotFound(err) && !errors.Is(err, errBeingDeleted) {
		if err = store.CheckTenantsVersion(d, 0); err != nil {
			return err
		}
		cm := &corev1.ConfigMap{ObjectMeta: objectMeta(tenantsObject, kindTenants, "")}
		if err := putJSON(cm, keyDirectory, d); err != nil {
			return err
		}
		_, err = objs.Create(cm)
		if apierrors.IsAlreadyExists(err) { // put meanwhile by another writer
			_, err = objs.Update(tenantsObject, replace)
		}
	}
	if err != nil && !errors.Is(err, store.ErrTenantsChanged) {
		return fmt.Errorf("put tenants version %d: %w", d.Version, err)
	}
	return err
}

// usageObject names the ConfigMap of a key's rows of one day.
func usageObject(day tenants.Day, keyID string) string {
	sum := sha256.Sum256([]byte(keyID))
	return "ferry-usage-" + day.String() + "-" + strconv.Itoa(int(sum[0])%usageShards)
}

// AddUsage implements store.TenantStore, one read-modify-write per day and shard.
func (s *Store) AddUsage(rows []tenants.Row) error {
	byObject := map[string][]tenants.Row{}
	var names []string
	for _, r := range rows {
		name := usageObject(r.Day, r.KeyID)
		if _, ok := byObject[name]; !ok {
			names = append(names, name)
		}
		byObject[name] = append(byObject[name], r)
	}
	slices.Sort(names)
	for i, name := range names {
		if err := s.addUsageTo(name, byObject[name]); err != nil {
			var unsaved []tenants.Row
			for _, n := range names[i:] {
				unsaved = append(unsaved, byObject[n]...)
			}
			return &store.UnsavedUsageError{Rows: unsaved, Err: fmt.Errorf("add usage to %s: %w", name, err)}
		}
	}
	return nil
}

// addUsageTo adds rows (all of one day and shard) to the ConfigMap name, creating it.
func (s *Store) addUsageTo(name string, rows []tenants.Row) error {
	objs := s.configMaps()
	add := func(cm *corev1.ConfigMap) error {
		var stored []tenants.Row
		if _, err := getJSON(cm, keyRows, &stored); err != nil {
			return err
		}
		return putJSON(cm, keyRows, mergeRows(stored, rows))
	}
	_, err := objs.Update(name, add)
	if apierrors.IsNotFound(err) && !errors.Is(err, errBeingDeleted) {
		meta := objectMeta(name, kindUsage, "")
		meta.Labels[labelDay] = rows[0].Day.String()
		cm := &corev1.ConfigMap{ObjectMeta: meta}
		if err := putJSON(cm, keyRows, mergeRows(nil, rows)); err != nil {
			return err
		}
		_, err = objs.Create(cm)
		if apierrors.IsAlreadyExists(err) {
			_, err = objs.Update(name, add)
		}
	}
	return err
}

// mergeRows adds rows to stored by Row.ID (a stored row keeps its team, or takes the first
// one given) and returns them ordered as Usage returns them.
func mergeRows(stored, rows []tenants.Row) []tenants.Row {
	out := slices.Clone(stored)
	at := make(map[tenants.RowID]int, len(out))
	for i := range out {
		at[out[i].ID()] = i
	}
	for _, r := range rows {
		i, ok := at[r.ID()]
		if !ok {
			at[r.ID()] = len(out)
			out = append(out, r)
			continue
		}
		o := &out[i]
		if o.Team == "" {
			o.Team = r.Team
		}
		o.Totals.Add(r.Totals)
	}
	slices.SortFunc(out, compareRows)
	return out
}

func compareRows(a, b tenants.Row) int {
	if a.Day != b.Day {
		return int(a.Day) - int(b.Day)
	}
	for _, c := range [][2]string{{a.KeyID, b.KeyID}, {a.Service, b.Service}, {a.Model, b.Model}} {
		if c[0] != c[1] {
			if c[0] < c[1] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// Usage implements store.TenantStore, from the cache: every shard of day since and after.
func (s *Store) Usage(since tenants.Day) ([]tenants.Row, error) {
	cms, err := s.cms.List(kindSelector(kindUsage, ""))
	if err != nil {
		return nil, fmt.Errorf("read usage: %w", err)
	}
	var out []tenants.Row
	for _, cm := range cms {
		var day tenants.Day
		if err := day.UnmarshalText([]byte(cm.Labels[labelDay])); err != nil {
			return nil, fmt.Errorf("read usage: ConfigMap %s: label %s: %w", cm.Name, labelDay, err)
		}
		if day < since || marked(cm) {
			continue
		}
		var rows []tenants.Row
		if _, err := getJSON(cm, keyRows, &rows); err != nil {
			return nil, fmt.Errorf("read usage: %w", err)
		}
		out = append(out, rows...)
	}
	slices.SortFunc(out, compareRows)
	return out, nil
}

package api

import (
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ferryserve/ferry/tenants"
)

// The directory edits behind the tenants routes: pure functions of the directory and the time,
// each refusing bad input with ErrInvalid and a message that names the field, an unknown key,
// team or model with ErrNotFound, and a name taken with ErrConflict.

// nameRE is what a key's or a team's name must be: a word of letters, digits, '.', '_' and
// '-', which a table, a CSV line and a shell show as it is.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// invalid, notFound and conflict are errors of the API's kinds answered with their message
// alone (an *Error), which says what is wrong in the caller's terms.
func invalid(format string, args ...any) error {
	return &Error{Kind: ErrInvalid, Msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &Error{Kind: ErrNotFound, Msg: fmt.Sprintf(format, args...)}
}

func conflict(format string, args ...any) error {
	return &Error{Kind: ErrConflict, Msg: fmt.Sprintf(format, args...)}
}

func checkName(field, name string) error {
	if !nameRE.MatchString(name) {
		return invalid("%s %q: want 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", field, name)
	}
	return nil
}

// Apply is l with the limits p names set.
func (p LimitsPatch) Apply(l tenants.Limits) tenants.Limits {
	for _, f := range []struct {
		v   *int64
		dst *int64
	}{
		{p.RequestsPerMinute, &l.RequestsPerMinute}, {p.RequestsPerDay, &l.RequestsPerDay},
		{p.InputTokensPerMinute, &l.InputTokensPerMinute}, {p.InputTokensPerDay, &l.InputTokensPerDay},
		{p.OutputTokensPerMinute, &l.OutputTokensPerMinute}, {p.OutputTokensPerDay, &l.OutputTokensPerDay},
		{p.TotalTokensPerMinute, &l.TotalTokensPerMinute}, {p.TotalTokensPerDay, &l.TotalTokensPerDay},
	} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	if p.BudgetUSD != nil {
		l.BudgetUSD = *p.BudgetUSD
	}
	if p.BudgetPeriod != nil {
		l.BudgetPeriod = *p.BudgetPeriod
	}
	return l
}

// checkLimits validates limits after a patch; a budget without a period renews monthly.
func checkLimits(l *tenants.Limits) error {
	if math.IsNaN(l.BudgetUSD) {
		return invalid("limits: budget_usd is not a number")
	}
	if err := l.Validate(); err != nil {
		return invalid("limits: %s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if l.BudgetUSD > 0 && l.BudgetPeriod == "" {
		l.BudgetPeriod = tenants.PeriodMonth
	}
	return nil
}

// checkScope validates and sorts a key's services or models, dropping repeats.
func checkScope(field string, list []string) ([]string, error) {
	var out []string
	for _, v := range list {
		if v == "" || len(v) > 256 || strings.ContainsAny(v, " \t\r\n,") {
			return nil, invalid("%s %q: want a name without spaces or commas, at most 256 characters", field, v)
		}
		out = append(out, v)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// newKey makes the key req asks for, and its secret, which only the answer carries.
func newKey(req CreateKeyRequest, now time.Time) (tenants.Key, string, error) {
	if err := checkName("name", req.Name); err != nil {
		return tenants.Key{}, "", err
	}
	if strings.HasPrefix(req.Name, "key_") {
		return tenants.Key{}, "", invalid("name %q: key_ starts key ids; pick another name", req.Name)
	}
	k := tenants.Key{Name: req.Name, Team: req.Team, PriorityHeader: req.PriorityHeader, CreatedAt: now.UTC()}
	upd := UpdateKeyRequest{Team: &req.Team, Services: &req.Services, Models: &req.Models, Priority: &req.Priority, Limits: req.Limits}
	if !req.ExpiresAt.IsZero() {
		upd.ExpiresAt = &req.ExpiresAt
	}
	if err := changeKey(&k, upd, now); err != nil {
		return tenants.Key{}, "", err
	}
	secret, err := tenants.NewSecret()
	if err != nil {
		return tenants.Key{}, "", err
	}
	if k.ID, err = tenants.NewKeyID(); err != nil {
		return tenants.Key{}, "", err
	}
	k.Hash, k.Hint = tenants.HashSecret(secret), tenants.HintOf(secret)
	return k, secret, k.Validate()
}

// addKey adds k, refusing a name an unrevoked key has.
func addKey(d *tenants.Directory, k tenants.Key) error {
	for _, o := range d.Keys {
		if o.ID == k.ID {
			return conflict("key id %s is taken; try again", k.ID)
		}
		if o.Name == k.Name && o.RevokedAt.IsZero() {
			return conflict("a key named %q exists (%s); revoke it first or pick another name", k.Name, o.ID)
		}
	}
	d.Keys = append(d.Keys, k)
	return nil
}

// findKey is the index of the key ref names: its id, else its name, the unrevoked key of that
// name before revoked ones (the newest of those).
func findKey(d *tenants.Directory, ref string) (int, error) {
	found := -1
	for i := range d.Keys {
		k := &d.Keys[i]
		if k.ID == ref {
			return i, nil
		}
		if k.Name == ref && (found < 0 || preferKey(k, &d.Keys[found])) {
			found = i
		}
	}
	if found < 0 {
		return 0, notFound("no key has the id or name %q", ref)
	}
	return found, nil
}

// preferKey reports whether a name finds k rather than cur: the unrevoked key of the name, else
// the one revoked last.
func preferKey(k, cur *tenants.Key) bool {
	switch {
	case cur.RevokedAt.IsZero():
		return false
	case k.RevokedAt.IsZero():
		return true
	}
	return k.RevokedAt.After(cur.RevokedAt)
}

// errRevoked refuses to change a revoked key: it stays as it was, for its usage.
func errRevoked(k *tenants.Key) error {
	return conflict("key %s (%s) was revoked at %s", k.ID, k.Name, k.RevokedAt.Format(time.RFC3339))
}

// revoke ends k at now; the record stays, for its usage.
func revoke(k *tenants.Key, now time.Time) error {
	if !k.RevokedAt.IsZero() {
		return errRevoked(k)
	}
	k.RevokedAt = now.UTC()
	return nil
}

// changeKey applies req to k.
func changeKey(k *tenants.Key, req UpdateKeyRequest, now time.Time) error {
	if !k.RevokedAt.IsZero() {
		return errRevoked(k)
	}
	var errs []error
	if req.Team != nil {
		if *req.Team != "" {
			errs = append(errs, checkName("team", *req.Team))
		}
		k.Team = *req.Team
	}
	var err error
	if req.Services != nil {
		k.Services, err = checkScope("service", *req.Services)
		errs = append(errs, err)
	}
	if req.Models != nil {
		k.Models, err = checkScope("model", *req.Models)
		errs = append(errs, err)
	}
	if req.ExpiresAt != nil {
		if !req.ExpiresAt.IsZero() && !req.ExpiresAt.After(now) {
			errs = append(errs, invalid("expires_at %s: that is past; want a time to come", req.ExpiresAt.UTC().Format(time.RFC3339)))
		}
		k.ExpiresAt = req.ExpiresAt.UTC()
	}
	if req.Priority != nil {
		p, err := tenants.ParsePriority(*req.Priority)
		if err != nil {
			errs = append(errs, invalid("%v", err))
		}
		k.Priority = p
	}
	if req.PriorityHeader != nil {
		k.PriorityHeader = *req.PriorityHeader
	}
	k.Limits = req.Limits.Apply(k.Limits)
	errs = append(errs, checkLimits(&k.Limits))
	return joinInvalid(errs)
}

// joinInvalid joins errors that are all ErrInvalid into one that is ErrInvalid once.
func joinInvalid(errs []error) error {
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return invalid("%s", strings.Join(msgs, "; "))
}

// stateOf is k's state at now.
func stateOf(k *tenants.Key, now time.Time) string {
	switch {
	case !k.RevokedAt.IsZero():
		return KeyRevoked
	case !k.Active(now):
		return KeyExpired
	}
	return KeyActive
}

// infoOf is k as the API shows it.
func infoOf(k tenants.Key, now time.Time) KeyInfo {
	return KeyInfo{ID: k.ID, Name: k.Name, Team: k.Team, Hint: k.Hint, Services: k.Services, Models: k.Models, ExpiresAt: k.ExpiresAt,
		Priority: k.Priority.String(), PriorityHeader: k.PriorityHeader, Limits: k.Limits, CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt,
		State: stateOf(&k, now)}
}

// keyList is every key by name, then oldest first.
func keyList(d tenants.Directory, now time.Time) []KeyInfo {
	out := make([]KeyInfo, 0, len(d.Keys))
	for _, k := range d.Keys {
		out = append(out, infoOf(k, now))
	}
	slices.SortStableFunc(out, func(a, b KeyInfo) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return a.CreatedAt.Compare(b.CreatedAt)
	})
	return out
}

// teamList is the teams by name.
func teamList(d tenants.Directory) []tenants.Team {
	out := slices.Clone(d.Teams)
	slices.SortFunc(out, func(a, b tenants.Team) int { return strings.Compare(a.Name, b.Name) })
	if out == nil {
		out = []tenants.Team{}
	}
	return out
}

// applyTeam creates the team name or changes the limits patch names.
func applyTeam(d *tenants.Directory, name string, patch LimitsPatch) (tenants.Team, error) {
	if err := checkName("team", name); err != nil {
		return tenants.Team{}, err
	}
	i := slices.IndexFunc(d.Teams, func(t tenants.Team) bool { return t.Name == name })
	if i < 0 {
		d.Teams = append(d.Teams, tenants.Team{Name: name})
		i = len(d.Teams) - 1
	}
	l := patch.Apply(d.Teams[i].Limits)
	if err := checkLimits(&l); err != nil {
		return tenants.Team{}, err
	}
	d.Teams[i].Limits = l
	return d.Teams[i], nil
}

// removeTeam forgets the team's limits; its keys keep its name.
func removeTeam(d *tenants.Directory, name string) error {
	i := slices.IndexFunc(d.Teams, func(t tenants.Team) bool { return t.Name == name })
	if i < 0 {
		return notFound("no team %q", name)
	}
	d.Teams = slices.Delete(d.Teams, i, i+1)
	return nil
}

// priceList is the prices by model.
func priceList(d tenants.Directory) []ModelPrice {
	out := []ModelPrice{}
	for _, m := range slices.Sorted(maps.Keys(d.Prices)) {
		out = append(out, ModelPrice{Model: m, Price: d.Prices[m]})
	}
	return out
}

// maxPricePerMillion bounds a price: far above any model's, low enough that a day's cost stays
// exact in micro-dollars.
const maxPricePerMillion = 1e5

// applyPrice sets a model's price.
func applyPrice(d *tenants.Directory, p ModelPrice) error {
	var errs []error
	if p.Model == "" || len(p.Model) > 256 || strings.ContainsAny(p.Model, " \t\r\n") {
		errs = append(errs, invalid("model %q: want a model name without spaces, at most 256 characters", p.Model))
	}
	for field, v := range map[string]float64{"input_per_million": p.InputPerMillion, "output_per_million": p.OutputPerMillion} {
		if math.IsNaN(v) || v < 0 || v > maxPricePerMillion {
			errs = append(errs, invalid("%s is %g: want dollars per million tokens, 0 to %g", field, v, float64(maxPricePerMillion)))
		}
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	if err := joinInvalid(errs); err != nil {
		return err
	}
	if d.Prices == nil {
		d.Prices = map[string]tenants.Price{}
	}
	d.Prices[p.Model] = p.Price
	return nil
}

// removePrice forgets a model's price.
func removePrice(d *tenants.Directory, model string) error {
	if _, ok := d.Prices[model]; !ok {
		return notFound("no price for model %q", model)
	}
	delete(d.Prices, model)
	return nil
}

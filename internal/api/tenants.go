package api

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/ferryserve/ferry/internal/rpc"
	"github.com/ferryserve/ferry/tenants"
)

// The tenants API: API keys (the secret is made here and answered once; the directory keeps its
// hash and a hint), team limits, model prices and the usage report behind `ferry keys` and
// `ferry usage`. Every route takes the controller token. The directory edits are in
// tenantsedit.go, the report in usage.go.

// TenantBackend is what the tenants routes need of the controller.
type TenantBackend interface {
	// Tenants is the directory the controller holds.
	Tenants() (tenants.Directory, error)
	// EditTenants runs edit on a copy of the newest directory and keeps the result as its next
	// version, which it returns; an error of edit is returned as is and nothing is kept.
	// edit may run more than once (when another writer got in first).
	EditTenants(edit func(d *tenants.Directory) error) (tenants.Directory, error)
	// UsageRows are the usage rows of day since and after, what the proxies reported until now.
	UsageRows(since tenants.Day) ([]tenants.Row, error)
}

// LimitsPatch sets the limits it names and leaves the others: a create applies it to no
// limits, an update to the key's or team's. Zero sets "no limit" on that dimension.
type LimitsPatch struct {
	RequestsPerMinute     *int64          `json:"requests_per_minute,omitempty"`
	RequestsPerDay        *int64          `json:"requests_per_day,omitempty"`
	InputTokensPerMinute  *int64          `json:"input_tokens_per_minute,omitempty"`
	InputTokensPerDay     *int64          `json:"input_tokens_per_day,omitempty"`
	OutputTokensPerMinute *int64          `json:"output_tokens_per_minute,omitempty"`
	OutputTokensPerDay    *int64          `json:"output_tokens_per_day,omitempty"`
	TotalTokensPerMinute  *int64          `json:"total_tokens_per_minute,omitempty"`
	TotalTokensPerDay     *int64          `json:"total_tokens_per_day,omitempty"`
	BudgetUSD             *float64        `json:"budget_usd,omitempty"`
	BudgetPeriod          *tenants.Period `json:"budget_period,omitempty"`
}

// CreateKeyRequest asks for a new key. Priority is a class name (tenants.ParsePriority),
// standard when empty; ExpiresAt zero is never.
type CreateKeyRequest struct {
	Name           string      `json:"name"`
	Team           string      `json:"team,omitempty"`
	Services       []string    `json:"services,omitempty"`
	Models         []string    `json:"models,omitempty"`
	ExpiresAt      time.Time   `json:"expires_at,omitzero"`
	Priority       string      `json:"priority,omitempty"`
	PriorityHeader bool        `json:"priority_header,omitempty"`
	Limits         LimitsPatch `json:"limits,omitzero"`
}

// UpdateKeyRequest changes what it names of a key: nil leaves a field, an empty team, scope
// list or expiry (the zero time) clears it.
type UpdateKeyRequest struct {
	Team           *string     `json:"team,omitempty"`
	Services       *[]string   `json:"services,omitempty"`
	Models         *[]string   `json:"models,omitempty"`
	ExpiresAt      *time.Time  `json:"expires_at,omitempty"`
	Priority       *string     `json:"priority,omitempty"`
	PriorityHeader *bool       `json:"priority_header,omitempty"`
	Limits         LimitsPatch `json:"limits,omitzero"`
}

// Key states, as `ferry keys list` shows them.
const (
	KeyActive  = "active"
	KeyExpired = "expired"
	KeyRevoked = "revoked"
)

// KeyInfo is a key as the API shows it: neither its secret nor its hash.
type KeyInfo struct {
	ID             string         `json:"id"`
	Name           string         `json:"name"`
	Team           string         `json:"team,omitempty"`
	Hint           string         `json:"hint"`
	Services       []string       `json:"services,omitempty"`
	Models         []string       `json:"models,omitempty"`
	ExpiresAt      time.Time      `json:"expires_at,omitzero"`
	Priority       string         `json:"priority"`
	PriorityHeader bool           `json:"priority_header,omitempty"`
	Limits         tenants.Limits `json:"limits,omitzero"`
	CreatedAt      time.Time      `json:"created_at"`
	RevokedAt      time.Time      `json:"revoked_at,omitzero"`
	// State is active, expired or revoked at the time of the answer.
	State string `json:"state"`
}

// CreatedKey is a new key with its secret, which the controller does not keep: this answer is
// the only place it is ever shown.
type CreatedKey struct {
	KeyInfo
	Secret string `json:"secret"`
}

// ModelPrice is one model's price.
type ModelPrice struct {
	Model string `json:"model"`
	tenants.Price
}

// TenantRoutes are the keys, teams, prices and usage routes.
func TenantRoutes(b TenantBackend, log *zap.Logger) []Route {
	h := tenantHandlers{b: b, log: log}
	return []Route{
		{Method: http.MethodPost, Pattern: "/v1/keys", Handler: h.createKey},
		{Method: http.MethodGet, Pattern: "/v1/keys", Handler: h.listKeys},
		{Method: http.MethodPost, Pattern: "/v1/keys/{ref}/revoke", Handler: h.revokeKey},
		{Method: http.MethodPost, Pattern: "/v1/keys/{ref}/update", Handler: h.updateKey},
		{Method: http.MethodGet, Pattern: "/v1/teams", Handler: h.listTeams},
		{Method: http.MethodPut, Pattern: "/v1/teams/{name}", Handler: h.setTeam},
		{Method: http.MethodDelete, Pattern: "/v1/teams/{name}", Handler: h.deleteTeam},
		{Method: http.MethodGet, Pattern: "/v1/prices", Handler: h.listPrices},
		{Method: http.MethodPost, Pattern: "/v1/prices", Handler: h.setPrice},
		{Method: http.MethodDelete, Pattern: "/v1/prices", Handler: h.deletePrice},
		{Method: http.MethodGet, Pattern: "/v1/usage", Handler: h.usage},
	}
}

type tenantHandlers struct {
	b   TenantBackend
	log *zap.Logger
}

// maxTenantBytes bounds a keys, teams or prices request.
const maxTenantBytes = 1 << 20

// decode reads r's body into v, answering 400 when it cannot.
func (h tenantHandlers) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := DecodeBody(w, r, maxTenantBytes, v); err != nil {
		rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "decode request: "+err.Error())
		return false
	}
	return true
}

func (h tenantHandlers) createKey(w http.ResponseWriter, r *http.Request) {
	var req CreateKeyRequest
	if !h.decode(w, r, &req) {
		return
	}
	now := time.Now()
	key, secret, err := newKey(req, now)
	if err == nil {
		_, err = h.b.EditTenants(func(d *tenants.Directory) error { return addKey(d, key) })
	}
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusCreated, CreatedKey{KeyInfo: infoOf(key, now), Secret: secret})
}

func (h tenantHandlers) listKeys(w http.ResponseWriter, _ *http.Request) {
	d, err := h.b.Tenants()
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, keyList(d, time.Now()))
}

func (h tenantHandlers) revokeKey(w http.ResponseWriter, r *http.Request) {
	h.editKey(w, r.PathValue("ref"), func(k *tenants.Key, now time.Time) error { return revoke(k, now) })
}

func (h tenantHandlers) updateKey(w http.ResponseWriter, r *http.Request) {
	var req UpdateKeyRequest
	if !h.decode(w, r, &req) {
		return
	}
	h.editKey(w, r.PathValue("ref"), func(k *tenants.Key, now time.Time) error { return changeKey(k, req, now) })
}

// editKey changes the key ref names (its id, else its name) and answers it as it is then.
func (h tenantHandlers) editKey(w http.ResponseWriter, ref string, edit func(k *tenants.Key, now time.Time) error) {
	now := time.Now()
	var out tenants.Key
	_, err := h.b.EditTenants(func(d *tenants.Directory) error {
		i, err := findKey(d, ref)
		if err != nil {
			return err
		}
		if err := edit(&d.Keys[i], now); err != nil {
			return err
		}
		out = d.Keys[i]
		return nil
	})
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, infoOf(out, now))
}

func (h tenantHandlers) listTeams(w http.ResponseWriter, _ *http.Request) {
	d, err := h.b.Tenants()
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, teamList(d))
}

func (h tenantHandlers) setTeam(w http.ResponseWriter, r *http.Request) {
	var patch LimitsPatch
	if !h.decode(w, r, &patch) {
		return
	}
	var out tenants.Team
	_, err := h.b.EditTenants(func(d *tenants.Directory) (err error) {
		out, err = applyTeam(d, r.PathValue("name"), patch)
		return err
	})
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, out)
}

func (h tenantHandlers) deleteTeam(w http.ResponseWriter, r *http.Request) {
	_, err := h.b.EditTenants(func(d *tenants.Directory) error { return removeTeam(d, r.PathValue("name")) })
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, map[string]string{"status": "deleted"})
}

func (h tenantHandlers) listPrices(w http.ResponseWriter, _ *http.Request) {
	d, err := h.b.Tenants()
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, priceList(d))
}

func (h tenantHandlers) setPrice(w http.ResponseWriter, r *http.Request) {
	var p ModelPrice
	if !h.decode(w, r, &p) {
		return
	}
	_, err := h.b.EditTenants(func(d *tenants.Directory) error { return applyPrice(d, p) })
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, p)
}

func (h tenantHandlers) deletePrice(w http.ResponseWriter, r *http.Request) {
	_, err := h.b.EditTenants(func(d *tenants.Directory) error { return removePrice(d, r.URL.Query().Get("model")) })
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, map[string]string{"status": "deleted"})
}

func (h tenantHandlers) usage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since tenants.Day
	if s := q.Get("since"); s != "" {
		if err := since.UnmarshalText([]byte(s)); err != nil {
			rpc.WriteErrorCode(w, http.StatusBadRequest, "invalid_request", "since "+strconv.Quote(s)+": want a day, 2006-01-02")
			return
		}
	}
	by := q.Get("by")
	if err := checkGroup(by); err != nil {
		WriteError(w, h.log, err)
		return
	}
	rows, err := h.b.UsageRows(since)
	var d tenants.Directory
	if err == nil {
		d, err = h.b.Tenants()
	}
	if err != nil {
		WriteError(w, h.log, err)
		return
	}
	WriteJSON(w, http.StatusOK, report(rows, d, since, by))
}

// CreateKey asks for a new key; the answer holds its secret, shown this once.
func (c *Client) CreateKey(ctx context.Context, req CreateKeyRequest) (CreatedKey, error) {
	var out CreatedKey
	err := c.Do(ctx, http.MethodPost, "/v1/keys", req, &out)
	return out, err
}

// Keys lists every key, revoked ones too.
func (c *Client) Keys(ctx context.Context) ([]KeyInfo, error) {
	var out []KeyInfo
	err := c.Do(ctx, http.MethodGet, "/v1/keys", nil, &out)
	return out, err
}

// RevokeKey revokes the key ref names (its id or its name).
func (c *Client) RevokeKey(ctx context.Context, ref string) (KeyInfo, error) {
	var out KeyInfo
	err := c.Do(ctx, http.MethodPost, "/v1/keys/"+url.PathEscape(ref)+"/revoke", nil, &out)
	return out, err
}

// UpdateKey changes what req names of the key ref names.
func (c *Client) UpdateKey(ctx context.Context, ref string, req UpdateKeyRequest) (KeyInfo, error) {
	var out KeyInfo
	err := c.Do(ctx, http.MethodPost, "/v1/keys/"+url.PathEscape(ref)+"/update", req, &out)
	return out, err
}

// Teams lists the teams with limits.
func (c *Client) Teams(ctx context.Context) ([]tenants.Team, error) {
	var out []tenants.Team
	err := c.Do(ctx, http.MethodGet, "/v1/teams", nil, &out)
	return out, err
}

// SetTeam creates a team or changes the limits patch names.
func (c *Client) SetTeam(ctx context.Context, name string, patch LimitsPatch) (tenants.Team, error) {
	var out tenants.Team
	err := c.Do(ctx, http.MethodPut, "/v1/teams/"+url.PathEscape(name), patch, &out)
	return out, err
}

// DeleteTeam forgets a team's limits; its keys keep its name (and their usage it).
func (c *Client) DeleteTeam(ctx context.Context, name string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/teams/"+url.PathEscape(name), nil, nil)
}

// Prices lists the model prices, by model.
func (c *Client) Prices(ctx context.Context) ([]ModelPrice, error) {
	var out []ModelPrice
	err := c.Do(ctx, http.MethodGet, "/v1/prices", nil, &out)
	return out, err
}

// SetPrice sets a model's price.
func (c *Client) SetPrice(ctx context.Context, p ModelPrice) error {
	return c.Do(ctx, http.MethodPost, "/v1/prices", p, nil)
}

// DeletePrice forgets a model's price: its tokens cost nothing from then on.
func (c *Client) DeletePrice(ctx context.Context, model string) error {
	return c.Do(ctx, http.MethodDelete, "/v1/prices?"+url.Values{"model": {model}}.Encode(), nil, nil)
}

// Usage reports the usage of day since and after, grouped by by ("" for every row).
func (c *Client) Usage(ctx context.Context, since tenants.Day, by string) (UsageReport, error) {
	var out UsageReport
	q := url.Values{"since": {since.String()}}
	if by != "" {
		q.Set("by", by)
	}
	err := c.Do(ctx, http.MethodGet, "/v1/usage?"+q.Encode(), nil, &out)
	return out, err
}

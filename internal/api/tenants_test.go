package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/ferryserve/ferry/tenants"
)

// memTenants is a TenantBackend in memory, versioned as the controller's is.
type memTenants struct {
	mu   sync.Mutex
	dir  tenants.Directory
	rows []tenants.Row
}

func (m *memTenants) Tenants() (tenants.Directory, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.dir, nil
}

func (m *memTenants) EditTenants(edit func(*tenants.Directory) error) (tenants.Directory, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := tenants.Directory{Version: m.dir.Version + 1, Keys: append([]tenants.Key(nil), m.dir.Keys...),
		Teams: append([]tenants.Team(nil), m.dir.Teams...), Prices: map[string]tenants.Price{}}
	for k, v := range m.dir.Prices {
		next.Prices[k] = v
	}
	if err := edit(&next); err != nil {
		return tenants.Directory{}, err
	}
	m.dir = next
	return next, nil
}

func (m *memTenants) UsageRows(since tenants.Day) ([]tenants.Row, error) {
	var out []tenants.Row
	for _, r := range m.rows {
		if r.Day >= since {
			out = append(out, r)
		}
	}
	return out, nil
}

// tenantsAPI serves the tenants routes over HTTP, behind the token, as the controller does.
func tenantsAPI(t *testing.T, m *memTenants) (*Client, *httptest.Server) {
	t.Helper()
	log := zaptest.NewLogger(t)
	srv := httptest.NewServer(NewHandler(&countingBackend{}, Tokens{Full: "tok"}, log, TenantRoutes(m, log)...))
	t.Cleanup(srv.Close)
	return NewClient(srv.URL, "tok"), srv
}

func ptr[T any](v T) *T { return &v }

// TestKeysRoundTrip: a created key's secret is answered once and kept only as its hash; lists
// show neither; revoke and update find keys by id or name.
func TestKeysRoundTrip(t *testing.T) {
	m := &memTenants{}
	c, srv := tenantsAPI(t, m)
	ctx := context.Background()
	created, err := c.CreateKey(ctx, CreateKeyRequest{Name: "alice", Team: "eng", Services: []string{"chat", "chat", "embed"},
		Priority: "interactive", Limits: LimitsPatch{RequestsPerMinute: ptr[int64](60), BudgetUSD: ptr(5.0)}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(created.Secret, "fy-") || !strings.HasPrefix(created.ID, "key_") || created.State != KeyActive ||
		created.Priority != "interactive" || !strings.HasPrefix(created.Secret, strings.TrimSuffix(created.Hint, "…")) {
		t.Errorf("created %+v", created)
	}
	stored := m.dir.Keys[0]
	if stored.Hash != tenants.HashSecret(created.Secret) || m.dir.Version != 1 {
		t.Errorf("stored key %+v at version %d: want the secret's hash at version 1", stored, m.dir.Version)
	}
	if diff := cmp.Diff([]string{"chat", "embed"}, stored.Services); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	if stored.Limits.BudgetPeriod != tenants.PeriodMonth {
		t.Errorf("budget period %q: a budget without a period renews monthly", stored.Limits.BudgetPeriod)
	}
	raw := get(t, srv.URL+"/v1/keys")
	if strings.Contains(raw, created.Secret) || strings.Contains(raw, stored.Hash) || strings.Contains(raw, `"hash"`) {
		t.Errorf("the key list shows the secret or its hash: %s", raw)
	}

	if _, err := c.CreateKey(ctx, CreateKeyRequest{Name: "alice"}); !errors.Is(err, ErrConflict) {
		t.Errorf("a second active alice: %v, want ErrConflict", err)
	}
	upd, err := c.UpdateKey(ctx, "alice", UpdateKeyRequest{Limits: LimitsPatch{TotalTokensPerDay: ptr[int64](1000)}, Priority: ptr("batch")})
	if err != nil {
		t.Fatal(err)
	}
	if upd.Limits.RequestsPerMinute != 60 || upd.Limits.TotalTokensPerDay != 1000 || upd.Priority != "batch" || upd.Team != "eng" {
		t.Errorf("updated %+v: want the rpm kept, tpd set, batch, the team kept", upd)
	}
	rev, err := c.RevokeKey(ctx, created.ID)
	if err != nil || rev.State != KeyRevoked || rev.RevokedAt.IsZero() {
		t.Fatalf("revoke by id: %+v, %v", rev, err)
	}
	if _, err := c.RevokeKey(ctx, "alice"); !errors.Is(err, ErrConflict) {
		t.Errorf("revoking a revoked key: %v, want ErrConflict", err)
	}
	if _, err := c.RevokeKey(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoking an unknown key: %v, want ErrNotFound", err)
	}
	again, err := c.CreateKey(ctx, CreateKeyRequest{Name: "alice"})
	if err != nil {
		t.Fatalf("alice again after the first was revoked: %v", err)
	}
	if rev, err := c.RevokeKey(ctx, "alice"); err != nil || rev.ID != again.ID {
		t.Errorf("revoke by name: %+v, %v; want the unrevoked alice, %s", rev, err, again.ID)
	}
	list, err := c.Keys(ctx)
	if err != nil || len(list) != 2 || list[0].State != KeyRevoked || list[1].State != KeyRevoked {
		t.Errorf("keys %+v, %v; want both alices, revoked", list, err)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestKeysRefuseBadInput: every bad field is a 400 that names it, and nothing is kept.
func TestKeysRefuseBadInput(t *testing.T) {
	m := &memTenants{}
	c, _ := tenantsAPI(t, m)
	ctx := context.Background()
	tests := map[string]struct {
		req  CreateKeyRequest
		want []string
	}{
		"no name":           {CreateKeyRequest{}, []string{`name ""`}},
		"name with a space": {CreateKeyRequest{Name: "a b"}, []string{`name "a b"`}},
		"name like an id":   {CreateKeyRequest{Name: "key_1"}, []string{"key_ starts key ids"}},
		"bad team":          {CreateKeyRequest{Name: "a", Team: "eng/x"}, []string{`team "eng/x"`}},
		"bad priority":      {CreateKeyRequest{Name: "a", Priority: "urgent"}, []string{`priority "urgent"`}},
		"negative limit":    {CreateKeyRequest{Name: "a", Limits: LimitsPatch{RequestsPerMinute: ptr[int64](-1)}}, []string{"requests_per_minute is -1"}},
		"two bad limits": {CreateKeyRequest{Name: "a", Limits: LimitsPatch{InputTokensPerDay: ptr[int64](-5), BudgetUSD: ptr(-1.0)}},
			[]string{"input_tokens_per_day is -5", "budget_usd is -1"}},
		"bad period":   {CreateKeyRequest{Name: "a", Limits: LimitsPatch{BudgetPeriod: ptr(tenants.Period("week"))}}, []string{`budget_period "week"`}},
		"past expiry":  {CreateKeyRequest{Name: "a", ExpiresAt: time.Now().Add(-time.Hour)}, []string{"expires_at", "past"}},
		"bad service":  {CreateKeyRequest{Name: "a", Services: []string{"a,b"}}, []string{`service "a,b"`}},
		"empty model":  {CreateKeyRequest{Name: "a", Models: []string{""}}, []string{`model ""`}},
		"several bads": {CreateKeyRequest{Name: "a", Team: "-x", Priority: "now"}, []string{`team "-x"`, `priority "now"`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := c.CreateKey(ctx, tc.req)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if len(m.dir.Keys) != 0 || m.dir.Version != 0 {
		t.Errorf("refused keys were kept: %+v", m.dir)
	}
}

// TestTeamsAndPrices: a team is created by its first set and patched by later ones; prices are
// set, listed by model (names with slashes too) and deleted; unknowns are 404, bad values 400.
func TestTeamsAndPrices(t *testing.T) {
	m := &memTenants{}
	c, _ := tenantsAPI(t, m)
	ctx := context.Background()
	if _, err := c.SetTeam(ctx, "eng", LimitsPatch{RequestsPerDay: ptr[int64](100)}); err != nil {
		t.Fatal(err)
	}
	team, err := c.SetTeam(ctx, "eng", LimitsPatch{TotalTokensPerMinute: ptr[int64](5000)})
	if err != nil || team.Limits != (tenants.Limits{RequestsPerDay: 100, TotalTokensPerMinute: 5000}) {
		t.Errorf("team after two sets: %+v, %v", team, err)
	}
	if _, err := c.SetTeam(ctx, "eng", LimitsPatch{OutputTokensPerMinute: ptr[int64](-3)}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "output_tokens_per_minute") {
		t.Errorf("bad team limit: %v", err)
	}
	if err := c.DeleteTeam(ctx, "ops"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete of an unknown team: %v", err)
	}
	for _, p := range []ModelPrice{{Model: "meta-llama/Llama-3.1-8B", Price: tenants.Price{InputPerMillion: 0.1, OutputPerMillion: 0.2}}, {Model: "bge"}} {
		if err := c.SetPrice(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.SetPrice(ctx, ModelPrice{Model: "x", Price: tenants.Price{InputPerMillion: -1}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "input_per_million is -1") {
		t.Errorf("negative price: %v", err)
	}
	if err := c.DeletePrice(ctx, "bge"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeletePrice(ctx, "bge"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete of a price: %v", err)
	}
	prices, err := c.Prices(ctx)
	want := []ModelPrice{{Model: "meta-llama/Llama-3.1-8B", Price: tenants.Price{InputPerMillion: 0.1, OutputPerMillion: 0.2}}}
	if diff := cmp.Diff(want, prices); err != nil || diff != "" {
		t.Errorf("prices (-want +got):\n%s%v", diff, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.DeleteTeam(ctx, "eng"))
	teams, err := c.Teams(ctx)
	must(err)
	if len(teams) != 0 || m.dir.Version != 6 {
		t.Errorf("teams %+v at version %d, want none at version 6 (one per change kept)", teams, m.dir.Version)
	}
}

// TestUsageReport: lines per group, ordered, with key names from the directory (revoked keys
// too) and exact totals.
func TestUsageReport(t *testing.T) {
	day := tenants.DayOf(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	r := func(key, team, svc, model string, d tenants.Day, n int64) tenants.Row {
		return tenants.Row{KeyID: key, Team: team, Service: svc, Model: model, Day: d, Totals: tenants.Totals{Requests: n, Input: 10 * n, Output: n, CostMicros: 1500 * n}}
	}
	rows := []tenants.Row{r("key_b", "eng", "chat", "llama", day, 1), r("key_a", "ops", "chat", "bge", day, 2), r("key_b", "eng", "embed", "bge", day+1, 4)}
	dir := tenants.Directory{Keys: []tenants.Key{{ID: "key_a", Name: "zed", RevokedAt: time.Now()}, {ID: "key_b", Name: "amy"}}}
	tot := func(n int64) tenants.Totals {
		return tenants.Totals{Requests: n, Input: 10 * n, Output: n, CostMicros: 1500 * n}
	}
	tests := map[string][]UsageLine{
		"":      {{Day: "2026-11-01", KeyID: "key_b", KeyName: "amy", Team: "eng", Service: "chat", Model: "llama", Totals: tot(1), CostUSD: 0.0015}, {Day: "2026-11-01", KeyID: "key_a", KeyName: "zed", Team: "ops", Service: "chat", Model: "bge", Totals: tot(2), CostUSD: 0.003}, {Day: "2026-11-02", KeyID: "key_b", KeyName: "amy", Team: "eng", Service: "embed", Model: "bge", Totals: tot(4), CostUSD: 0.006}},
		ByKey:   {{KeyID: "key_b", KeyName: "amy", Totals: tot(5), CostUSD: 0.0075}, {KeyID: "key_a", KeyName: "zed", Totals: tot(2), CostUSD: 0.003}},
		ByTeam:  {{Team: "eng", Totals: tot(5), CostUSD: 0.0075}, {Team: "ops", Totals: tot(2), CostUSD: 0.003}},
		ByModel: {{Model: "bge", Totals: tot(6), CostUSD: 0.009}, {Model: "llama", Totals: tot(1), CostUSD: 0.0015}},
		ByDay:   {{Day: "2026-11-01", Totals: tot(3), CostUSD: 0.0045}, {Day: "2026-11-02", Totals: tot(4), CostUSD: 0.006}},
	}
	for by, want := range tests {
		t.Run("by "+by, func(t *testing.T) {
			got := report(rows, dir, day, by)
			if diff := cmp.Diff(want, got.Lines); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
			if got.Total.Totals != tot(7) || got.Total.CostUSD != 0.0105 {
				t.Errorf("total %+v", got.Total)
			}
		})
	}
	for micros, want := range map[int64]string{0: "0.000000", 1: "0.000001", 12_345_678: "12.345678", -5: "-0.000005"} {
		if got := DollarsText(micros); got != want {
			t.Errorf("DollarsText(%d) = %s, want %s", micros, got, want)
		}
	}
}

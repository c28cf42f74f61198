package tenants

import (
	"crypto/sha256"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func key(id string, l Limits) *Key {
	return &Key{ID: id, Name: id, Hash: strings.Repeat("ab", 32), Limits: l}
}

func TestAdmitRequestsPerMinuteIsABucket(t *testing.T) {
	l := NewLedger()
	k := key("k1", Limits{RequestsPerMinute: 60})
	for i := range 60 {
		d, tk := l.Admit(k, nil, "svc", "m", Price{}, 0, t0)
		if !d.OK {
			t.Fatalf("request %d refused: %s", i, d.Refusal)
		}
		l.Settle(&tk, 0, 0, false, t0)
	}
	d, _ := l.Admit(k, nil, "svc", "m", Price{}, 0, t0)
	if d.OK || d.RetryAfter < time.Second || d.RetryAfter > 2*time.Second {
		t.Fatalf("61st request at once: %+v, want refused, retry after about 1 s", d)
	}
	if d.Requests.Limit != 60 || d.Requests.Remaining != 0 || d.Requests.Reset != time.Minute {
		t.Fatalf("request window %+v, want 60 / 0 / 1m", d.Requests)
	}
	// A second later one request's worth has drained.
	if d, _ := l.Admit(k, nil, "svc", "m", Price{}, 0, t0.Add(time.Second)); !d.OK {
		t.Fatalf("a second later: %s", d.Refusal)
	}
}

func TestAdmitTokensChargesTheEstimateAndSettlesTheCount(t *testing.T) {
	l := NewLedger()
	k := key("k1", Limits{TotalTokensPerMinute: 1000, OutputTokensPerDay: 500})
	d, tk := l.Admit(k, nil, "svc", "m", Price{}, 400, t0)
	if !d.OK || d.Tokens.Limit != 1000 || d.Tokens.Remaining != 600 {
		t.Fatalf("first: %+v, want admitted with 600 of 1000 tokens left", d)
	}
	// The engine counted 300 prompt tokens and generated 200: 500 of 1000 used.
	l.Settle(&tk, 300, 200, false, t0)
	d, tk = l.Admit(k, nil, "svc", "m", Price{}, 500, t0)
	if !d.OK || d.Tokens.Remaining != 0 {
		t.Fatalf("second: %+v, want admitted with nothing left", d)
	}
	l.Settle(&tk, -1, 300, false, t0) // output per day is now 500: spent
	d, _ = l.Admit(k, nil, "svc", "m", Price{}, 1, t0.Add(time.Hour))
	if d.OK || !strings.Contains(d.Refusal, "output tokens per day") || d.RetryAfter != 11*time.Hour {
		t.Fatalf("after 500 output tokens: %+v, want the daily output limit, retry at midnight", d)
	}
	if d, _ := l.Admit(k, nil, "svc", "m", Price{}, 1, t0.Add(12*time.Hour)); !d.OK {
		t.Fatalf("the next day: %s", d.Refusal)
	}
}

func TestAdmitRefusesWhatNoMinuteCanHold(t *testing.T) {
	l := NewLedger()
	d, _ := l.Admit(key("k", Limits{InputTokensPerMinute: 100}), nil, "s", "m", Price{}, 101, t0)
	if d.OK || !d.TooLarge {
		t.Fatalf("%+v, want TooLarge", d)
	}
}

func TestTeamLimitsHoldAcrossItsKeys(t *testing.T) {
	l := NewLedger()
	team := &Team{Name: "t", Limits: Limits{RequestsPerDay: 3}}
	a, b := key("a", Limits{}), key("b", Limits{})
	a.Team, b.Team = "t", "t"
	for i, k := range []*Key{a, b, a} {
		if d, _ := l.Admit(k, team, "s", "m", Price{}, 0, t0); !d.OK {
			t.Fatalf("request %d: %s", i, d.Refusal)
		}
	}
	if d, _ := l.Admit(b, team, "s", "m", Price{}, 0, t0); d.OK || !strings.Contains(d.Refusal, "team t") {
		t.Fatalf("fourth: %+v, want the team's limit", d)
	}
}

func TestBudgetPricesTokens(t *testing.T) {
	l := NewLedger()
	k := key("k", Limits{BudgetUSD: 1, BudgetPeriod: PeriodDay})
	p := Price{InputPerMillion: 1, OutputPerMillion: 2}
	d, tk := l.Admit(k, nil, "s", "m", p, 100, t0)
	if !d.OK {
		t.Fatal(d.Refusal)
	}
	if c := l.Settle(&tk, 200_000, 400_000, false, t0); c != 1_000_000 {
		t.Fatalf("cost %d micro-dollars, want 1,000,000 ($0.20 + $0.80)", c)
	}
	d, _ = l.Admit(k, nil, "s", "m", p, 1, t0)
	if d.OK || !d.Budget {
		t.Fatalf("%+v, want the budget spent", d)
	}
	if d, _ := l.Admit(k, nil, "s", "m", p, 1, t0.Add(12*time.Hour)); !d.OK {
		t.Fatalf("a day budget renews: %s", d.Refusal)
	}
}

// Two proxies that sync with one hub every 100 ms admit a per-minute limit between them within
// what they admit in one sync interval.
func TestLimitsAreGlobalAcrossProxies(t *testing.T) {
	hub := NewHub(1)
	a, b := NewLedger(), NewLedger()
	k := key("k", Limits{TotalTokensPerMinute: 100_000})
	sync := func(l *Ledger, name string, now time.Time) { l.Apply(hub.Sync(l.Take(name), now), now) }
	sync(a, "a", t0)
	sync(b, "b", t0)
	var admitted int64
	for step := range 600 { // a minute: each proxy tries 10 requests of 500 tokens per 100 ms
		now := t0.Add(time.Duration(step) * 100 * time.Millisecond)
		for _, l := range []*Ledger{a, b} {
			for range 10 {
				if d, tk := l.Admit(k, nil, "s", "m", Price{}, 500, now); d.OK {
					admitted += 500
					l.Settle(&tk, 500, 0, false, now)
				}
			}
		}
		sync(a, "a", now)
		sync(b, "b", now)
	}
	// A bucket of 100k that refills 100k a minute admits at most 200k in a minute.
	if admitted < 190_000 || admitted > 210_000 {
		t.Fatalf("admitted %d tokens in a minute across two proxies, want 200,000 within 5%%", admitted)
	}
	rows := hub.TakeDirty()
	var sum int64
	for _, r := range rows {
		sum += r.Input
	}
	if sum != admitted {
		t.Fatalf("the hub's rows count %d input tokens, the proxies admitted %d", sum, admitted)
	}
}

// A proxy cut off from the hub enforces its share.
func TestStaleLedgerEnforcesItsShare(t *testing.T) {
	hub := NewHub(1)
	a := NewLedger()
	hub.Sync(SyncRequest{Proxy: "other"}, t0)
	a.Apply(hub.Sync(a.Take("a"), t0), t0)
	k := key("k", Limits{RequestsPerMinute: 100})
	later := t0.Add(StaleAfter + time.Second)
	n := 0
	for range 100 {
		if d, tk := a.Admit(k, nil, "s", "m", Price{}, 0, later); d.OK {
			n++
			a.Settle(&tk, 0, 0, false, later)
		}
	}
	if n != 50 {
		t.Fatalf("a stale proxy of two admitted %d of a limit of 100, want 50", n)
	}
}

func TestFailedSyncResendsItsRows(t *testing.T) {
	hub := NewHub(1)
	l := NewLedger()
	k := key("k", Limits{})
	_, tk := l.Admit(k, nil, "s", "m", Price{}, 10, t0)
	l.Settle(&tk, 12, 5, false, t0)
	l.Fail(l.Take("p"))
	l.Apply(hub.Sync(l.Take("p"), t0), t0)
	rows := hub.TakeDirty()
	if len(rows) != 1 || rows[0].Requests != 1 || rows[0].Input != 12 || rows[0].Output != 5 {
		t.Fatalf("rows %+v, want one request of 12 in and 5 out", rows)
	}
}

func TestHubLoadKeepsTodayAndTheBudgets(t *testing.T) {
	hub := NewHub(2)
	today := DayOf(t0)
	hub.Load([]Row{
		{KeyID: "k", Team: "t", Day: today, Totals: Totals{Requests: 3, Input: 30, CostMicros: 7}},
		{KeyID: "k", Team: "t", Day: today - 40, Totals: Totals{Requests: 9, CostMicros: 100}},
	}, t0)
	ans := hub.Sync(SyncRequest{Proxy: "p"}, t0)
	if len(ans.Accounts) != 2 {
		t.Fatalf("accounts %+v, want the key's and the team's", ans.Accounts)
	}
	g := ans.Accounts[0]
	if g.Account != "key:k" || g.DayUsed.Requests != 3 || g.MonthCost != 7 || g.TotalCost != 107 || !g.Cum.Zero() {
		t.Fatalf("loaded %+v", g)
	}
	if rows := hub.TakeDirty(); rows != nil {
		t.Fatalf("loaded rows are not new use: %+v", rows)
	}
}

func TestKeyScopeExpiryAndClass(t *testing.T) {
	k := Key{Services: []string{"a"}, Models: []string{"m"}, ExpiresAt: t0, Priority: PriorityStandard, PriorityHeader: true}
	if !k.Allows("a", "m") || k.Allows("b", "m") || k.Allows("a", "n") {
		t.Fatal("scope")
	}
	if !k.Active(t0.Add(-time.Second)) || k.Active(t0) {
		t.Fatal("expiry")
	}
	if k.ClassFor("batch") != PriorityBatch || k.ClassFor("interactive") != PriorityStandard || k.ClassFor("nonsense") != PriorityStandard {
		t.Fatal("a key may lower its class by header, never raise it")
	}
	s, err := NewSecret()
	if err != nil || !strings.HasPrefix(s, "fy-") || len(s) != 43 {
		t.Fatalf("secret %q %v", s, err)
	}
	x := NewIndex(Directory{Keys: []Key{{ID: "k", Name: "k", Hash: HashSecret(s)}, {ID: "r", Name: "r", Hash: HashSecret("x"), RevokedAt: t0}}})
	if x.Lookup(sum(s)) == nil || x.Lookup(sum("x")) != nil {
		t.Fatal("index: the active key is found, the revoked one not")
	}
}

func sum(s string) (h [32]byte) {
	copy(h[:], mustHex(HashSecret(s)))
	return h
}

// A ledger finds an indexed key's accounts by its *Key (Ledger.byKey), and they must stay the
// ledger's own: the same account under every directory version, another ledger's apart, a team
// that changes between versions followed.
func TestIndexedKeysKeepTheirAccounts(t *testing.T) {
	secret := "fy-cached"
	sum := sha256.Sum256([]byte(secret))
	dir := func(v int64, team string, teamRPM int64) Directory {
		return Directory{Version: v, Keys: []Key{{ID: "k", Name: "k", Team: team, Hash: HashSecret(secret), Limits: Limits{RequestsPerMinute: 2}}},
			Teams: []Team{{Name: "t1", Limits: Limits{RequestsPerMinute: teamRPM}}, {Name: "t2", Limits: Limits{RequestsPerMinute: teamRPM}}}}
	}
	admit := func(l *Ledger, x *Index) bool {
		k := x.Lookup(sum)
		d, tk := l.Admit(k, x.Team(k), "svc", "m", Price{}, 0, t0)
		if d.OK {
			l.Settle(&tk, 0, 0, false, t0)
		}
		return d.OK
	}
	x1 := NewIndex(dir(1, "t1", 100))
	l := NewLedger()
	for i, want := range []bool{true, true, false} {
		if got := admit(l, x1); got != want {
			t.Fatalf("admission %d under one index: %v, want %v (the key's limit is 2 a minute)", i+1, got, want)
		}
	}
	if admit(l, NewIndex(dir(2, "t1", 100))) {
		t.Error("a new directory version started the key's account afresh")
	}
	if !admit(NewLedger(), x1) {
		t.Error("another ledger charged the first ledger's account")
	}
	// The key moves to team t2, whose limit of 1 a minute it has not used: one more request
	// passes the team, none passes the key.
	l2 := NewLedger()
	x3 := NewIndex(dir(3, "t1", 1))
	for i, want := range []bool{true, false} {
		if got := admit(l2, x3); got != want {
			t.Fatalf("admission %d in team t1: %v, want %v (the team's limit is 1 a minute)", i+1, got, want)
		}
	}
	if !admit(l2, NewIndex(dir(4, "t2", 1))) {
		t.Error("the key, moved to team t2, was charged against t1")
	}
	// One key admitted first without its team's record, then with it: the team is charged.
	l3 := NewLedger()
	k := x3.Lookup(sum)
	if d, _ := l3.Admit(k, nil, "svc", "m", Price{}, 0, t0); !d.OK {
		t.Fatal(d.Refusal)
	}
	if d, _ := l3.Admit(k, x3.Team(k), "svc", "m", Price{}, 0, t0); !d.OK {
		t.Fatal(d.Refusal)
	}
	if used := l3.account(accountID{team: true, name: "t1"}).used[dimRequests]; used != 1 {
		t.Errorf("team t1 charged %v requests, want 1", used)
	}
}

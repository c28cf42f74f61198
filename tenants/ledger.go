package tenants

import (
	"fmt"
	"maps"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Ledger is one proxy process's view of every key's and team's use, which it admits requests
// against. A request is charged as it is admitted (one request, its estimated prompt tokens) and
// settled when its answer ends (the prompt tokens the engine counted, the tokens it generated,
// their cost), so concurrent requests cannot all pass a limit that only one of them fits.
//
// Every proxy charges its own requests at once; the others' reach it at each Sync with the
// controller's Hub (Take, then Apply with the answer, or Fail). While the hub is unreachable
// (no answer for StaleAfter), each per-minute allowance shrinks to this proxy's share, the
// limit divided by the number of proxies the hub last counted, so N proxies cut off from the
// controller still admit about the limit between them. Daily counts and budgets go on from the
// last global count plus this proxy's own use.
type Ledger struct {
	// keys and teams are the accounts by name (→ *account): two maps keyed by a plain string
	// hash faster than one keyed by a struct.
	keys, teams sync.Map

	// byKey finds the accounts of a key by the *Key an Index handed out, one lookup of a
	// pointer instead of two of strings (accounts); copied on write under byKeyMu.
	byKey   atomic.Pointer[map[*Key]keyAccounts]
	byKeyMu sync.Mutex

	mu    sync.Mutex // guards the sync cursor
	epoch int64
	seq   int64

	proxies  atomic.Int64 // how many proxies share the limits, as the hub last said (≥ 1)
	syncedAt atomic.Int64 // unix nanoseconds of the last answer; 0 before the first
	stale    time.Duration
}

// StaleAfter is how long a ledger that has synced once goes without an answer before it
// enforces only its share of each per-minute limit.
const StaleAfter = 3 * time.Second

// NewLedger returns an empty ledger that has never synced: it enforces whole limits, as a
// lone proxy should.
func NewLedger() *Ledger {
	l := &Ledger{stale: StaleAfter}
	l.proxies.Store(1)
	return l
}

// Dimensions of a per-minute bucket.
const (
	dimRequests = iota
	dimInput
	dimOutput
	dimTotal
	dims
)

var dimNames = [dims]string{"requests", "input tokens", "output tokens", "tokens"}

// accountID names an account without building a string per request.
type accountID struct {
	team bool
	name string
}

func (id accountID) String() string {
	if id.team {
		return TeamAccount(id.name)
	}
	return KeyAccount(id.name)
}

func parseAccount(s string) (accountID, bool) {
	if name, ok := strings.CutPrefix(s, "key:"); ok {
		return accountID{name: name}, true
	}
	if name, ok := strings.CutPrefix(s, "team:"); ok {
		return accountID{team: true, name: name}, true
	}
	return accountID{}, false
}

// account is one key's or team's use as this proxy sees it.
type account struct {
	mu sync.Mutex
	// rows are a key's use since the last Take, by service, model and day (a team has none:
	// its use is its keys'); rowsGen counts the Takes, so that a ticket's row is known current.
	rows    map[RowID]*Row
	rowsGen uint64
	// used is each per-minute bucket's level in its dimension's units, as of at: it drains
	// at the limit per minute.
	used [dims]float64
	at   int64 // unix nanoseconds
	// The day's use, the month's and all-time cost: the hub's last count plus this proxy's
	// use since.
	day       Day
	dayUsed   Totals
	month     int32
	monthCost int64
	totalCost int64
	// Sync bookkeeping: the use charged since the last Take, the use in the sync under way,
	// and the hub's cumulative count last heard (in epoch).
	unsent, sending Totals
	seenCum         Totals
	seenEpoch       int64
}

// keyAccounts is what byKey holds for a key: its account, and its team's for one team record.
type keyAccounts struct {
	team     *Team
	key, tac *account
}

// byKeyMax bounds byKey: keys of directory versions gone stay in it until it is full, when it
// starts afresh (and refills with the keys in use).
const byKeyMax = 8192

// accounts returns the accounts of key k and of its team t (nil without one). Accounts are never
// dropped, so once a *Key has been admitted here (a proxy's keys come from one Index per
// directory version) they are found by the pointer alone.
func (l *Ledger) accounts(k *Key, t *Team) (ka, ta *account) {
	if m := l.byKey.Load(); m != nil {
		if c, ok := (*m)[k]; ok && c.team == t {
			return c.key, c.tac
		}
	}
	ka = l.account(accountID{name: k.ID})
	if t != nil {
		ta = l.account(accountID{team: true, name: t.Name})
	}
	l.byKeyMu.Lock()
	defer l.byKeyMu.Unlock()
	next := map[*Key]keyAccounts{}
	if old := l.byKey.Load(); old != nil && len(*old) < byKeyMax {
		next = maps.Clone(*old)
	}
	next[k] = keyAccounts{team: t, key: ka, tac: ta}
	l.byKey.Store(&next)
	return ka, ta
}

func (l *Ledger) account(id accountID) *account {
	m := &l.keys
	if id.team {
		m = &l.teams
	}
	if a, ok := m.Load(id.name); ok {
		return a.(*account)
	}
	a, _ := m.LoadOrStore(id.name, &account{})
	return a.(*account)
}

// each calls f with every account, its lock held.
func (l *Ledger) each(f func(a *account)) {
	for _, m := range []*sync.Map{&l.keys, &l.teams} {
		m.Range(func(_, v any) bool {
			a := v.(*account)
			a.mu.Lock()
			f(a)
			a.mu.Unlock()
			return true
		})
	}
}

// Window is one limit as OpenAI's x-ratelimit-* headers show it: the limit, what is left of it,
// and how long until it is whole again.
type Window struct {
	Limit, Remaining int64
	Reset            time.Duration
}

// Decision is Admit's verdict.
type Decision struct {
	OK bool
	// Refusal says which limit refused, for the 429's message; Budget marks a spent dollar
	// budget (OpenAI's insufficient_quota) and TooLarge a request no per-minute allowance can
	// ever hold.
	Refusal          string
	Budget, TooLarge bool
	RetryAfter       time.Duration
	// Requests and Tokens are the key's tightest request and token limits, for the headers;
	// a zero Limit means the key has none.
	Requests, Tokens Window
}

// Ticket is what Admit charged, which Settle completes.
type Ticket struct {
	key, team *account
	// rowPtr is the key's row Admit charged, still the one to settle while rowGen is the
	// account's: settling then costs no map lookup.
	rowPtr               *Row
	rowGen               uint64
	keyLimits, teamLimit Limits
	row                  RowID
	teamName             string
	estimate             int64
	price                Price
}

// Admit decides whether key k (of team t, nil without one) may send a request to model on
// service whose prompt is estimated at estIn tokens, at now. When it may, the request and its
// estimate are charged and the ticket must be settled.
func (l *Ledger) Admit(k *Key, t *Team, service, model string, price Price, estIn int64, now time.Time) (Decision, Ticket) {
	share := l.share(now)
	ka, ta := l.accounts(k, t)
	var tl Limits
	if t != nil {
		tl = t.Limits
	}
	tk := Ticket{key: ka, team: ta, keyLimits: k.Limits, teamLimit: tl, teamName: k.Team, estimate: estIn, price: price,
		row: RowID{KeyID: k.ID, Service: service, Model: model, Day: DayOf(now)}}
	ns := now.UnixNano()
	charge := [dims]float64{1, float64(estIn), 0, float64(estIn)}

	ka.mu.Lock()
	if ta != nil {
		ta.mu.Lock()
	}
	ka.advance(ns, &k.Limits, share)
	d := ka.check(&k.Limits, charge, share, now, "key", k.Name)
	if d.OK && ta != nil {
		ta.advance(ns, &tl, share)
		d = ta.check(&tl, charge, share, now, "team", t.Name)
	}
	if d.OK {
		use := Totals{Requests: 1, Input: estIn}
		ka.charge(charge, use)
		tk.rowPtr, tk.rowGen = ka.addRow(tk.row, k.Team, use), ka.rowsGen
		if ta != nil {
			ta.charge(charge, use)
		}
	}
	d.Requests, d.Tokens = ka.windows(&k.Limits, share, now)
	if ta != nil {
		ta.mu.Unlock()
	}
	ka.mu.Unlock()
	return d, tk
}

// Settle completes an admitted request: in and out are the prompt and generated tokens as the
// engine reported or the proxy counted them (in < 0: the estimate stands), failed an answer that
// was not a success. It returns the request's cost in micro-dollars.
func (l *Ledger) Settle(tk *Ticket, in, out int64, failed bool, now time.Time) int64 {
	if tk.key == nil {
		return 0
	}
	if in < 0 {
		in = tk.estimate
	}
	out = max(out, 0)
	dIn := in - tk.estimate
	use := Totals{Input: dIn, Output: out, CostMicros: tk.price.CostMicros(in, out)}
	if failed {
		use.Errors = 1
	}
	charge := [dims]float64{0, float64(dIn), float64(out), float64(dIn + out)}
	share := l.share(now)
	ns := now.UnixNano()
	ka := tk.key
	ka.mu.Lock()
	ka.advance(ns, &tk.keyLimits, share)
	ka.charge(charge, use)
	if tk.rowPtr != nil && tk.rowGen == ka.rowsGen {
		tk.rowPtr.Totals.Add(use)
	} else {
		ka.addRow(tk.row, tk.teamName, use)
	}
	ka.mu.Unlock()
	if ta := tk.team; ta != nil {
		ta.mu.Lock()
		ta.advance(ns, &tk.teamLimit, share)
		ta.charge(charge, use)
		ta.mu.Unlock()
	}
	tk.key = nil
	return use.CostMicros
}

// addRow adds use to the key's row of id and returns the row; a.mu is held.
func (a *account) addRow(id RowID, team string, use Totals) *Row {
	r := a.rows[id]
	if r == nil {
		if a.rows == nil {
			a.rows = map[RowID]*Row{}
		}
		r = &Row{KeyID: id.KeyID, Team: team, Service: id.Service, Model: id.Model, Day: id.Day}
		a.rows[id] = r
	}
	r.Totals.Add(use)
	return r
}

// share is the part of each per-minute limit this proxy may use at now: all of it while the hub
// answers (it sees the others' use), its share of the proxies once the hub has gone quiet.
func (l *Ledger) share(now time.Time) float64 {
	at := l.syncedAt.Load()
	if at == 0 || now.UnixNano()-at <= int64(l.stale) {
		return 1
	}
	return 1 / float64(l.proxies.Load())
}

// advance drains the per-minute buckets to ns and rolls the day and month over.
func (a *account) advance(ns int64, lim *Limits, share float64) {
	if a.at != 0 && ns > a.at {
		dt := float64(ns-a.at) / float64(time.Minute)
		for i, per := range minuteLimits(lim) {
			if per > 0 {
				a.used[i] = max(0, a.used[i]-dt*float64(per)*share)
			}
		}
	}
	a.at = max(a.at, ns)
	day := Day(ns / int64(24*time.Hour))
	if day != a.day {
		if a.day != 0 && day > a.day {
			a.dayUsed = Totals{}
		}
		a.day = max(a.day, day)
		if m := a.day.Month(); m != a.month {
			if a.month != 0 && m > a.month {
				a.monthCost = 0
			}
			a.month = max(a.month, m)
		}
	}
}

func minuteLimits(l *Limits) [dims]int64 {
	return [dims]int64{l.RequestsPerMinute, l.InputTokensPerMinute, l.OutputTokensPerMinute, l.TotalTokensPerMinute}
}

func dayLimits(l *Limits) [dims]int64 {
	return [dims]int64{l.RequestsPerDay, l.InputTokensPerDay, l.OutputTokensPerDay, l.TotalTokensPerDay}
}

func dayUse(t Totals) [dims]int64 {
	return [dims]int64{t.Requests, t.Input, t.Output, t.Input + t.Output}
}

// check decides whether charge fits every limit of lim. Output is not known ahead: a request
// passes its output limits while any allowance is left.
func (a *account) check(lim *Limits, charge [dims]float64, share float64, now time.Time, kind, name string) Decision {
	d := a.refusal(lim, charge, share, now)
	if !d.OK {
		d.Refusal = fmt.Sprintf(d.Refusal, kind+" "+name) // built only for a refusal
	}
	return d
}

// refusal is check with "%[1]s" in the refusal where the account's name goes.
func (a *account) refusal(lim *Limits, charge [dims]float64, share float64, now time.Time) Decision {
	for i, per := range minuteLimits(lim) {
		if per <= 0 {
			continue
		}
		cap := float64(per) * share
		need := max(charge[i], 1)
		if i == dimOutput {
			need = 1
		}
		if need > float64(per) {
			return Decision{Refusal: fmt.Sprintf("the request's %.0f %s exceed the %%[1]s limit of %d per minute", need, dimNames[i], per), TooLarge: true}
		}
		if a.used[i]+need > cap {
			wait := time.Duration((a.used[i] + need - cap) / (float64(per) * share) * float64(time.Minute))
			return Decision{Refusal: fmt.Sprintf("the %%[1]s limit of %d %s per minute is reached", per, dimNames[i]), RetryAfter: max(wait, time.Second)}
		}
	}
	// When a period renews is worked out only for a refusal: calendar arithmetic would be most
	// of an admission's cost.
	used := dayUse(a.dayUsed)
	for i, per := range dayLimits(lim) {
		need := int64(charge[i])
		if i == dimOutput {
			need = 1
		}
		if per > 0 && used[i]+need > per {
			return Decision{Refusal: fmt.Sprintf("the %%[1]s limit of %d %s per day is reached", per, dimNames[i]), RetryAfter: a.renews(PeriodDay, now)}
		}
	}
	if lim.BudgetUSD > 0 {
		spent := a.monthCost
		switch lim.BudgetPeriod {
		case PeriodDay:
			spent = a.dayUsed.CostMicros
		case PeriodTotal:
			spent = a.totalCost
		}
		if float64(spent) >= lim.BudgetUSD*1e6 {
			return Decision{Refusal: fmt.Sprintf("the %%[1]s budget of $%.2f is spent", lim.BudgetUSD), Budget: true, RetryAfter: a.renews(lim.BudgetPeriod, now)}
		}
	}
	return Decision{OK: true}
}

// renews is how long after now a spent allowance of period p is whole again: the next UTC day,
// the next calendar month (a budget without a period), never (0) for a total.
func (a *account) renews(p Period, now time.Time) time.Duration {
	start := a.day.Start()
	switch p {
	case PeriodDay:
		return start.Add(24 * time.Hour).Sub(now)
	case PeriodTotal:
		return 0
	}
	return start.AddDate(0, 1, 1-start.Day()).Sub(now)
}

func (a *account) charge(c [dims]float64, use Totals) {
	for i := range c {
		a.used[i] = max(0, a.used[i]+c[i])
	}
	a.dayUsed.Add(use)
	a.monthCost += use.CostMicros
	a.totalCost += use.CostMicros
	a.unsent.Add(use)
}

// windows reports the tightest request and token limits of lim, per minute before per day.
func (a *account) windows(lim *Limits, share float64, now time.Time) (req, tok Window) {
	minute, day := minuteLimits(lim), dayLimits(lim)
	window := func(i int) Window {
		if per := minute[i]; per > 0 {
			cap := float64(per) * share
			left := max(0, cap-a.used[i])
			return Window{Limit: per, Remaining: int64(left), Reset: time.Duration(a.used[i] / (float64(per) * share) * float64(time.Minute))}
		}
		if per := day[i]; per > 0 {
			return Window{Limit: per, Remaining: max(0, per-dayUse(a.dayUsed)[i]), Reset: a.day.Start().Add(24 * time.Hour).Sub(now)}
		}
		return Window{}
	}
	req = window(dimRequests)
	for _, i := range []int{dimTotal, dimInput, dimOutput} {
		if w := window(i); w.Limit > 0 && (tok.Limit == 0 || frac(w) < frac(tok)) {
			tok = w
		}
	}
	return req, tok
}

func frac(w Window) float64 { return float64(w.Remaining) / math.Max(1, float64(w.Limit)) }

// Take starts a sync: the rows of use since the last one, with the cursor the hub needs. Exactly
// one sync is under way at a time; it ends with Apply or Fail.
func (l *Ledger) Take(proxy string) SyncRequest {
	l.mu.Lock()
	req := SyncRequest{Proxy: proxy, Epoch: l.epoch, Seq: l.seq}
	l.mu.Unlock()
	l.each(func(a *account) {
		for _, r := range a.rows {
			req.Rows = append(req.Rows, *r)
		}
		if len(a.rows) > 0 {
			clear(a.rows)
			a.rowsGen++
		}
		a.sending, a.unsent = a.unsent, Totals{}
	})
	return req
}

// Fail ends a sync the hub did not answer: its rows go back to be sent with the next.
func (l *Ledger) Fail(req SyncRequest) {
	for i := range req.Rows {
		r := &req.Rows[i]
		a := l.account(accountID{name: r.KeyID})
		a.mu.Lock()
		a.addRow(r.ID(), r.Team, r.Totals)
		a.mu.Unlock()
	}
	l.each(func(a *account) {
		a.unsent.Add(a.sending)
		a.sending = Totals{}
	})
}

// Apply ends a sync with the hub's answer: every other proxy's use since the last answer is
// charged to the per-minute buckets, and the day's and budgets' counts become the hub's plus
// this proxy's use since Take.
func (l *Ledger) Apply(ans SyncAnswer, now time.Time) {
	ns := now.UnixNano()
	for i := range ans.Accounts {
		g := &ans.Accounts[i]
		id, ok := parseAccount(g.Account)
		if !ok {
			continue
		}
		a := l.account(id)
		a.mu.Lock()
		if a.seenEpoch == ans.Epoch {
			others := g.Cum.minus(a.seenCum).minus(a.sending)
			c := [dims]float64{float64(others.Requests), float64(others.Input), float64(others.Output), float64(others.Input + others.Output)}
			for j := range c {
				a.used[j] = max(0, a.used[j]+max(c[j], 0))
			}
		}
		a.seenCum, a.seenEpoch = g.Cum, ans.Epoch
		a.at = max(a.at, ns)
		if g.Day >= a.day {
			a.day, a.dayUsed = g.Day, g.DayUsed
			a.dayUsed.Add(a.unsent)
		}
		if g.Month >= a.month {
			a.month, a.monthCost = g.Month, g.MonthCost+a.unsent.CostMicros
		}
		a.totalCost = g.TotalCost + a.unsent.CostMicros
		a.mu.Unlock()
	}
	l.each(func(a *account) { a.sending = Totals{} })
	l.mu.Lock()
	l.epoch, l.seq = ans.Epoch, ans.Seq
	l.mu.Unlock()
	l.proxies.Store(int64(max(ans.Proxies, 1)))
	l.syncedAt.Store(ns)
}

// Open reports whether the ticket still waits for Settle.
func (tk *Ticket) Open() bool { return tk.key != nil }

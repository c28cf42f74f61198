package tenants

import (
	"sort"
	"sync"
	"time"
)

// Hub is the controller's side of the limits: every proxy (the controller's own and each
// attached one) sends it the use it admitted since its last sync, and gets back what every
// proxy together has used, per key and team. That makes a limit global: a proxy charges its own
// requests at once and the others' at each sync, so N proxies overshoot a limit by at most what
// they admit between two syncs. The hub also gathers the rows the controller persists for
// `ferry usage`.
//
// The hub holds no lock across calls out; the controller persists TakeDirty's rows.
type Hub struct {
	mu       sync.Mutex
	epoch    int64
	seq      int64
	accounts map[string]*hubAccount
	dirty    map[RowID]*Row
	proxies  map[string]time.Time
}

type hubAccount struct {
	g       Global
	changed int64 // the hub's seq when g last changed
}

// Global is what every proxy together has used of one account ("key:ID" or "team:NAME").
type Global struct {
	Account string `json:"account"`
	// Cum is the use since the hub started (its epoch): a proxy learns the others' use from how
	// much Cum grew beyond what it sent itself.
	Cum Totals `json:"cum"`
	// Day and DayUsed are today's use (UTC); MonthCost this calendar month's and TotalCost all
	// the cost ever recorded, for dollar budgets of each period.
	Day       Day    `json:"day"`
	DayUsed   Totals `json:"day_used"`
	Month     int32  `json:"month"`
	MonthCost int64  `json:"month_cost_micros"`
	TotalCost int64  `json:"total_cost_micros"`
}

// SyncRequest is a proxy's report: who it is, the hub epoch and sequence it last heard, and the
// rows of use it admitted since its last report.
type SyncRequest struct {
	Proxy string `json:"proxy"`
	Epoch int64  `json:"epoch"`
	Seq   int64  `json:"seq"`
	Rows  []Row  `json:"rows,omitempty"`
}

// SyncAnswer is the hub's: the accounts that changed since the sequence the proxy last heard
// (all of them when the proxy heard another epoch), and how many proxies share the limits.
type SyncAnswer struct {
	Epoch    int64    `json:"epoch"`
	Seq      int64    `json:"seq"`
	Proxies  int      `json:"proxies"`
	Accounts []Global `json:"accounts,omitempty"`
}

// proxyLive is how long a proxy counts as sharing the limits after its last sync.
const proxyLive = 10 * time.Second

// NewHub starts a hub. epoch tells this hub's counters from an earlier one's (the controller's
// start time in nanoseconds will do); a proxy that heard another epoch starts its diffs afresh.
func NewHub(epoch int64) *Hub {
	return &Hub{epoch: epoch, accounts: map[string]*hubAccount{}, dirty: map[RowID]*Row{}, proxies: map[string]time.Time{}}
}

// KeyAccount and TeamAccount name the accounts a row counts against.
func KeyAccount(id string) string    { return "key:" + id }
func TeamAccount(name string) string { return "team:" + name }

// Load restores the day, month and all-time use from persisted rows, so a restarted controller
// keeps enforcing daily limits and budgets. Loaded rows are not dirty.
func (h *Hub) Load(rows []Row, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	for i := range rows {
		h.count(&rows[i], now, false)
	}
}

// Sync adds a proxy's rows and answers with what changed since it last heard.
func (h *Hub) Sync(req SyncRequest, now time.Time) SyncAnswer {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	for i := range req.Rows {
		h.count(&req.Rows[i], now, true)
	}
	if req.Proxy != "" {
		h.proxies[req.Proxy] = now
	}
	live := 0
	for p, at := range h.proxies {
		if now.Sub(at) > proxyLive {
			delete(h.proxies, p)
			continue
		}
		live++
	}
	ans := SyncAnswer{Epoch: h.epoch, Seq: h.seq, Proxies: max(live, 1)}
	since := req.Seq
	if req.Epoch != h.epoch {
		since = -1
	}
	for _, a := range h.accounts {
		if a.changed > since {
			h.roll(&a.g, now)
			ans.Accounts = append(ans.Accounts, a.g)
		}
	}
	sort.Slice(ans.Accounts, func(i, j int) bool { return ans.Accounts[i].Account < ans.Accounts[j].Account })
	return ans
}

// count adds a row to its key's and team's accounts, and to the dirty rows when it is new use.
func (h *Hub) count(r *Row, now time.Time, fresh bool) {
	if r.Totals.Zero() {
		return
	}
	h.charge(KeyAccount(r.KeyID), r, now, fresh)
	if r.Team != "" {
		h.charge(TeamAccount(r.Team), r, now, fresh)
	}
	if !fresh {
		return
	}
	id := r.ID()
	if d, ok := h.dirty[id]; ok {
		d.Totals.Add(r.Totals)
	} else {
		c := *r
		h.dirty[id] = &c
	}
}

func (h *Hub) charge(account string, r *Row, now time.Time, fresh bool) {
	a := h.accounts[account]
	if a == nil {
		a = &hubAccount{g: Global{Account: account}}
		h.accounts[account] = a
	}
	g := &a.g
	h.roll(g, now)
	a.changed = h.seq
	if fresh {
		g.Cum.Add(r.Totals)
	}
	if r.Day == g.Day || (fresh && r.Day > g.Day) {
		// A row from a proxy whose clock is ahead of the hub's still counts today.
		g.DayUsed.Add(r.Totals)
	}
	if r.Day.Month() == g.Month || (fresh && r.Day.Month() > g.Month) {
		g.MonthCost += r.CostMicros
	}
	g.TotalCost += r.CostMicros
}

// roll starts a new day or month in g when now has passed into one.
func (h *Hub) roll(g *Global, now time.Time) {
	if d := DayOf(now); d != g.Day {
		g.Day, g.DayUsed = d, Totals{}
		if m := d.Month(); m != g.Month {
			g.Month, g.MonthCost = m, 0
		}
	}
}

// TakeDirty returns the use added since the last call, as rows that add to what is persisted.
// If persisting them fails, Restore puts them back.
func (h *Hub) TakeDirty() []Row {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.dirty) == 0 {
		return nil
	}
	rows := make([]Row, 0, len(h.dirty))
	for _, r := range h.dirty {
		rows = append(rows, *r)
	}
	clear(h.dirty)
	sort.Slice(rows, func(i, j int) bool { return rowLess(&rows[i], &rows[j]) })
	return rows
}

// Restore puts back rows TakeDirty returned that could not be persisted.
func (h *Hub) Restore(rows []Row) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range rows {
		id := rows[i].ID()
		if d, ok := h.dirty[id]; ok {
			d.Totals.Add(rows[i].Totals)
		} else {
			c := rows[i]
			h.dirty[id] = &c
		}
	}
}

func rowLess(a, b *Row) bool {
	if a.Day != b.Day {
		return a.Day < b.Day
	}
	if a.KeyID != b.KeyID {
		return a.KeyID < b.KeyID
	}
	if a.Service != b.Service {
		return a.Service < b.Service
	}
	return a.Model < b.Model
}

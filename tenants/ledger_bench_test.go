package tenants

import (
	"testing"
	"time"
)

// BenchmarkAdmitSettle is one request's charge: admitted against a key's and a team's
// per-minute and per-day limits and budget, then settled with the engine's counts.
func BenchmarkAdmitSettle(b *testing.B) {
	l := NewLedger()
	big := Limits{RequestsPerMinute: 1 << 36, RequestsPerDay: 1 << 38, TotalTokensPerMinute: 1 << 38, TotalTokensPerDay: 1 << 39, BudgetUSD: 1e8}
	k := key("k", big)
	k.Team = "t"
	team := &Team{Name: "t", Limits: big}
	p := Price{InputPerMillion: 1, OutputPerMillion: 2}
	now := t0
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, tk := l.Admit(k, team, "svc", "m", p, 100, now)
			if !d.OK {
				b.Fatal(d.Refusal)
			}
			l.Settle(&tk, 90, 20, false, now.Add(time.Millisecond))
		}
	})
}

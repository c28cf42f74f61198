package tenants

import (
	"crypto/sha256"
	"testing"
	"time"
)

// BenchmarkAdmitSettle is one request's charge: admitted against a key's and a team's
// per-minute and per-day limits and budget, then settled with the engine's counts. The key and
// team come from an Index, as a proxy's do.
func BenchmarkAdmitSettle(b *testing.B) {
	l := NewLedger()
	big := Limits{RequestsPerMinute: 1 << 36, RequestsPerDay: 1 << 38, TotalTokensPerMinute: 1 << 38, TotalTokensPerDay: 1 << 39, BudgetUSD: 1e8}
	secret := "fy-bench"
	x := NewIndex(Directory{Version: 1, Keys: []Key{{ID: "k", Name: "k", Team: "t", Hash: HashSecret(secret), Limits: big}},
		Teams: []Team{{Name: "t", Limits: big}}})
	k := x.Lookup(sha256.Sum256([]byte(secret)))
	team := x.Team(k)
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

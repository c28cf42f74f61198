// Package tenants is who may call a Ferry endpoint and how much: API keys with scopes, expiry and
// a priority class; per-key and per-team limits in requests and tokens, per minute and per day,
// and a budget in dollars from per-model token prices; the ledger a proxy admits and charges
// requests against (ledger.go), and the controller's hub that makes those limits global across
// every proxy of the fleet and keeps the usage (hub.go).
//
// It is a leaf: it imports nothing of Ferry's, so the proxy, the attach follower and the
// controller can all use it. Nothing here does I/O; the controller persists what the hub holds.
package tenants

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"
)

// Priority is a request's class when replicas are saturated: interactive requests are served
// first, batch requests are shed first. The zero value is standard.
type Priority int8

const (
	PriorityBatch       Priority = -1
	PriorityStandard    Priority = 0
	PriorityInteractive Priority = 1
)

// Priorities in the order they are written (`ferry keys create --priority`, x-ferry-priority).
var priorityNames = map[Priority]string{PriorityBatch: "batch", PriorityStandard: "standard", PriorityInteractive: "interactive"}

func (p Priority) String() string {
	if s, ok := priorityNames[p]; ok {
		return s
	}
	return fmt.Sprintf("priority(%d)", int8(p))
}

// ParsePriority reads a priority class by name; "sheddable" is batch (the Gateway API Inference
// Extension's word for it).
func ParsePriority(s string) (Priority, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "interactive", "critical":
		return PriorityInteractive, nil
	case "standard", "":
		return PriorityStandard, nil
	case "batch", "sheddable":
		return PriorityBatch, nil
	}
	return 0, fmt.Errorf("priority %q: want interactive, standard or batch", s)
}

func (p Priority) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *Priority) UnmarshalText(b []byte) error {
	v, err := ParsePriority(string(b))
	*p = v
	return err
}

// Limits bound a key's or a team's use. Zero means no limit on that dimension. Per-minute limits
// are token buckets (the whole minute's allowance at once, refilled evenly), as OpenAI's are;
// per-day limits count from 00:00 UTC. Input tokens are a request's prompt, output tokens what
// the replica generated, total both.
type Limits struct {
	RequestsPerMinute     int64 `json:"requests_per_minute,omitempty"`
	RequestsPerDay        int64 `json:"requests_per_day,omitempty"`
	InputTokensPerMinute  int64 `json:"input_tokens_per_minute,omitempty"`
	InputTokensPerDay     int64 `json:"input_tokens_per_day,omitempty"`
	OutputTokensPerMinute int64 `json:"output_tokens_per_minute,omitempty"`
	OutputTokensPerDay    int64 `json:"output_tokens_per_day,omitempty"`
	TotalTokensPerMinute  int64 `json:"total_tokens_per_minute,omitempty"`
	TotalTokensPerDay     int64 `json:"total_tokens_per_day,omitempty"`
	// BudgetUSD is the most the key (or team) may spend per BudgetPeriod, priced by the
	// directory's per-model prices; a model without a price costs nothing.
	BudgetUSD    float64 `json:"budget_usd,omitempty"`
	BudgetPeriod Period  `json:"budget_period,omitempty"`
}

// Period is what a dollar budget renews with: a UTC day, a UTC calendar month, or never.
type Period string

const (
	PeriodDay   Period = "day"
	PeriodMonth Period = "month"
	PeriodTotal Period = "total"
)

// Zero reports whether l limits nothing.
func (l Limits) Zero() bool { return l == Limits{} }

// Validate names the first field out of range.
func (l Limits) Validate() error {
	var errs []error
	for name, v := range map[string]int64{
		"requests_per_minute": l.RequestsPerMinute, "requests_per_day": l.RequestsPerDay,
		"input_tokens_per_minute": l.InputTokensPerMinute, "input_tokens_per_day": l.InputTokensPerDay,
		"output_tokens_per_minute": l.OutputTokensPerMinute, "output_tokens_per_day": l.OutputTokensPerDay,
		"total_tokens_per_minute": l.TotalTokensPerMinute, "total_tokens_per_day": l.TotalTokensPerDay,
	} {
		if v < 0 || v > maxLimit {
			errs = append(errs, fmt.Errorf("%s is %d: want 0 (no limit) to %d", name, v, int64(maxLimit)))
		}
	}
	if l.BudgetUSD < 0 || l.BudgetUSD > maxBudgetUSD {
		errs = append(errs, fmt.Errorf("budget_usd is %g: want 0 (no budget) to %g", l.BudgetUSD, float64(maxBudgetUSD)))
	}
	switch l.BudgetPeriod {
	case "", PeriodDay, PeriodMonth, PeriodTotal:
	default:
		errs = append(errs, fmt.Errorf("budget_period %q: want day, month or total", l.BudgetPeriod))
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// Bounds that keep the ledger's arithmetic (nanoseconds per token, micro-dollars) in int64.
const (
	maxLimit     = 1 << 40
	maxBudgetUSD = 1e9
)

// Price is what a model's tokens cost, in US dollars per million.
type Price struct {
	InputPerMillion  float64 `json:"input_per_million"`
	OutputPerMillion float64 `json:"output_per_million"`
}

// CostMicros is the price of in and out tokens in micro-dollars (millionths of a dollar):
// integers, so that sums across proxies and days are exact.
func (p Price) CostMicros(in, out int64) int64 {
	return int64(float64(in)*p.InputPerMillion + float64(out)*p.OutputPerMillion + 0.5)
}

// Key is an API key as the controller keeps it: never the secret, only its hash.
type Key struct {
	// ID is the key's public handle ("key_" and 12 hex digits), used to revoke it and in usage.
	ID   string `json:"id"`
	Name string `json:"name"`
	// Team groups keys under shared limits; empty is no team.
	Team string `json:"team,omitempty"`
	// Hash is the hex SHA-256 of the secret (HashSecret).
	Hash string `json:"hash"`
	// Hint is the secret's first characters, to tell keys apart in a list.
	Hint string `json:"hint"`
	// Services and Models the key may call; empty means every one.
	Services []string `json:"services,omitempty"`
	Models   []string `json:"models,omitempty"`
	// ExpiresAt is when the key stops working; zero never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Priority is the class of the key's requests; with PriorityHeader the key may pick a class
	// at or below it per request with x-ferry-priority.
	Priority       Priority  `json:"priority"`
	PriorityHeader bool      `json:"priority_header,omitempty"`
	Limits         Limits    `json:"limits,omitzero"`
	CreatedAt      time.Time `json:"created_at"`
	RevokedAt      time.Time `json:"revoked_at,omitzero"`
}

// Team is a group of keys whose use is limited together, on top of each key's own limits.
type Team struct {
	Name   string `json:"name"`
	Limits Limits `json:"limits,omitzero"`
}

// Directory is every key, team and price, as the controller keeps them and hands them to proxies.
// Version grows with every change, so a proxy knows whether it has the newest.
type Directory struct {
	Version int64            `json:"version"`
	Keys    []Key            `json:"keys,omitempty"`
	Teams   []Team           `json:"teams,omitempty"`
	Prices  map[string]Price `json:"prices,omitempty"`
}

// secretPrefix marks Ferry's keys, as "sk-" marks OpenAI's: a secret scanner can find them.
const secretPrefix = "fy-"

var secretAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// NewSecret makes a key's secret: "fy-" and 40 base-62 characters (238 bits) from crypto/rand.
func NewSecret() (string, error) {
	b := make([]byte, 0, len(secretPrefix)+40)
	b = append(b, secretPrefix...)
	max := big.NewInt(int64(len(secretAlphabet)))
	for range 40 {
		n, err := rand.Int(rand.Reader, max)
		if err != nil {
			return "", err
		}
		b = append(b, secretAlphabet[n.Int64()])
	}
	return string(b), nil
}

// NewKeyID makes a key's public handle.
func NewKeyID() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "key_" + hex.EncodeToString(b[:]), nil
}

// HashSecret is how a key is stored and compared: the hex SHA-256 of the secret, as
// configs.HashAPIKey hashes a service's keys.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// HintOf is the part of a secret a list shows: its prefix and four characters.
func HintOf(secret string) string {
	n := min(len(secret), len(secretPrefix)+4)
	return secret[:n] + "…"
}

// Active reports whether the key may be used at now.
func (k *Key) Active(now time.Time) bool {
	return k.RevokedAt.IsZero() && (k.ExpiresAt.IsZero() || now.Before(k.ExpiresAt))
}

// Allows reports whether the key may call model on service; an empty scope allows all.
func (k *Key) Allows(service, model string) bool {
	return (len(k.Services) == 0 || slices.Contains(k.Services, service)) &&
		(len(k.Models) == 0 || model == "" || slices.Contains(k.Models, model))
}

// ClassFor is the priority a request of the key gets: the key's own, or the one its
// x-ferry-priority header asks for when the key may ask, never above the key's own.
func (k *Key) ClassFor(header string) Priority {
	if !k.PriorityHeader || header == "" {
		return k.Priority
	}
	p, err := ParsePriority(header)
	if err != nil || p > k.Priority {
		return k.Priority
	}
	return p
}

// Validate checks a key before the controller keeps it.
func (k *Key) Validate() error {
	var errs []error
	if k.Name == "" {
		errs = append(errs, errors.New("a key needs a name"))
	}
	if len(k.Hash) != 2*sha256.Size {
		errs = append(errs, errors.New("a key's hash must be a hex SHA-256"))
	}
	if err := k.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Index finds active keys by hash; it is built once per directory version and read without locks.
type Index struct {
	dir    Directory
	byHash map[[sha256.Size]byte]*Key
	teams  map[string]*Team
}

// NewIndex indexes d. Revoked keys are left out; expired ones are kept and refused by time.
func NewIndex(d Directory) *Index {
	x := &Index{dir: d, byHash: make(map[[sha256.Size]byte]*Key, len(d.Keys)), teams: make(map[string]*Team, len(d.Teams))}
	for i := range d.Keys {
		k := &d.Keys[i]
		var h [sha256.Size]byte
		if n, err := hex.Decode(h[:], []byte(k.Hash)); err != nil || n != sha256.Size || !k.RevokedAt.IsZero() {
			continue
		}
		x.byHash[h] = k
	}
	for i := range d.Teams {
		x.teams[d.Teams[i].Name] = &d.Teams[i]
	}
	return x
}

// Version is the directory version indexed.
func (x *Index) Version() int64 {
	if x == nil {
		return 0
	}
	return x.dir.Version
}

// Empty reports whether no key is indexed: then the proxy leaves auth to the service's own keys.
func (x *Index) Empty() bool { return x == nil || len(x.byHash) == 0 }

// Lookup finds the key whose secret hashes to sum.
func (x *Index) Lookup(sum [sha256.Size]byte) *Key {
	if x == nil {
		return nil
	}
	return x.byHash[sum]
}

// Team returns the key's team, nil without one (or when the team has no record: no limits).
func (x *Index) Team(k *Key) *Team {
	if x == nil || k.Team == "" {
		return nil
	}
	return x.teams[k.Team]
}

// Price returns model's price; a model without one costs nothing.
func (x *Index) Price(model string) Price {
	if x == nil {
		return Price{}
	}
	return x.dir.Prices[model]
}

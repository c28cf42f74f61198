// Package fakefault is the outage switch the fake clouds share (fakeec2, fakecompute): while a
// fault is set, the API requests it matches fail the way a real endpoint fails — an error
// status with the API's own error code, throttling, an answer that comes late, or a connection
// accepted and never answered — so that tests and demos show what Ferry does when a cloud, a
// region or a zone misbehaves. Each fake turns a matched Fault into its API's error format; this
// package holds what they share: the fault, matching, and the spec strings of
// `ferry fakecloud --fault` and `ferry fakecloud fault`.
package fakefault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is one outage: which requests it takes, and what they get instead of their answer.
type Fault struct {
	// Region and Zone limit the fault to requests about them ("" matches any; a request
	// about no zone, such as a global operation, is matched only by a fault with neither).
	// A Region matches the zones in it.
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// Ops limits the fault to these operations, as the fake names them (EC2's Action, e.g.
	// "DescribeInstances"; Compute's "instances.list", "instances.insert", ...); empty is every
	// operation.
	Ops []string `json:"ops,omitempty"`
	// Status is the HTTP status to answer, with Code (the API's error code or reason) and
	// Message; the fake picks its API's usual code for the status when Code is empty.
	Status  int    `json:"status,omitempty"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	// Throttle answers with the API's throttling error (EC2 RequestLimitExceeded, Compute 429
	// rateLimitExceeded), whatever Status says.
	Throttle bool `json:"throttle,omitempty"`
	// Hang accepts the request and never answers it: the client's deadline must cut it.
	Hang bool `json:"hang,omitempty"`
	// Delay answers late (then normally, unless another field says otherwise).
	Delay time.Duration `json:"delay,omitempty"`
	// Rate is the share of matching requests that get the fault: 0 (or 1) is all of them.
	Rate float64 `json:"rate,omitempty"`
	// For ends the fault this long after it was set: a cloud that recovers; 0 is until cleared.
	For time.Duration `json:"for,omitempty"`
}

// Request is what a fake knows of a request, for matching.
type Request struct {
	Op     string
	Region string
	Zone   string
}

// Switch holds the faults set on one fake. It is safe for concurrent use; the zero value has
// no fault.
type Switch struct {
	mu     sync.Mutex
	faults []active
	rng    *rand.Rand
	// cleared is closed when the faults change, releasing hung requests of a cleared hang.
	cleared chan struct{}
	// held counts the requests in Wait.
	held atomic.Int64
}

type active struct {
	Fault
	until time.Time
}

// Set replaces every fault with faults (none clears them).
func (s *Switch) Set(faults ...Fault) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = s.faults[:0]
	for _, f := range faults {
		a := active{Fault: f}
		if f.For > 0 {
			a.until = now.Add(f.For)
		}
		s.faults = append(s.faults, a)
	}
	if s.cleared != nil {
		close(s.cleared)
	}
	s.cleared = make(chan struct{})
}

// Add sets one more fault.
func (s *Switch) Add(f Fault) {
	s.mu.Lock()
	cur := make([]Fault, 0, len(s.faults)+1)
	now := time.Now()
	for _, a := range s.faults {
		if a.until.IsZero() || now.Before(a.until) {
			g := a.Fault
			if !a.until.IsZero() {
				g.For = a.until.Sub(now)
			}
			cur = append(cur, g)
		}
	}
	s.mu.Unlock()
	s.Set(append(cur, f)...)
}

// Clear removes every fault and lets hung requests go on to answer.
func (s *Switch) Clear() { s.Set() }

// Faults are the faults in force, with For set to what is left of theirs.
func (s *Switch) Faults() []Fault {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Fault
	for _, a := range s.faults {
		if !a.until.IsZero() && !now.Before(a.until) {
			continue
		}
		f := a.Fault
		if !a.until.IsZero() {
			f.For = a.until.Sub(now)
		}
		out = append(out, f)
	}
	return out
}

// Match returns the first fault in force that takes r (Rate drawn here), with For set to what
// is left of it, so that a hang holds the request only until the fault ends.
func (s *Switch) Match(r Request) (Fault, bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.faults {
		if (!a.until.IsZero() && !now.Before(a.until)) || !a.matches(r) {
			continue
		}
		if a.Rate > 0 && a.Rate < 1 {
			if s.rng == nil {
				s.rng = rand.New(rand.NewPCG(uint64(now.UnixNano()), 7))
			}
			if s.rng.Float64() >= a.Rate {
				continue
			}
		}
		f := a.Fault
		if !a.until.IsZero() {
			f.For = a.until.Sub(now)
		}
		return f, true
	}
	return Fault{}, false
}

// inForce reports whether f (as Match returned it) is still set and not expired: a change to
// other faults does not release a request f holds.
func (s *Switch) inForce(f Fault) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.faults {
		if (a.until.IsZero() || now.Before(a.until)) && a.sameAs(f) {
			return true
		}
	}
	return false
}

// sameAs compares every field but For, which Match rewrites.
func (f Fault) sameAs(g Fault) bool {
	return f.Region == g.Region && f.Zone == g.Zone && slices.Equal(f.Ops, g.Ops) && f.Status == g.Status &&
		f.Code == g.Code && f.Message == g.Message && f.Throttle == g.Throttle && f.Hang == g.Hang &&
		f.Delay == g.Delay && f.Rate == g.Rate
}

func (f Fault) matches(r Request) bool {
	if len(f.Ops) > 0 && !slices.Contains(f.Ops, r.Op) {
		return false
	}
	region := r.Region
	if region == "" && r.Zone != "" {
		region = RegionOf(r.Zone)
	}
	if f.Zone != "" && f.Zone != r.Zone {
		return false
	}
	return f.Region == "" || f.Region == region || f.Region == r.Zone
}

// RegionOf is a GCP or AWS zone's region: "us-central1-a" → "us-central1", "us-east-1a" →
// "us-east-1"; a region is its own ("us-east-1").
func RegionOf(zone string) string {
	if i := strings.LastIndexByte(zone, '-'); i > 0 && i < len(zone)-1 {
		if tail := zone[i+1:]; len(tail) == 1 && tail[0] >= 'a' && tail[0] <= 'z' {
			return zone[:i] // GCP: REGION-x
		}
	}
	if n := len(zone); n > 1 && zone[n-1] >= 'a' && zone[n-1] <= 'z' && zone[n-2] >= '0' && zone[n-2] <= '9' {
		return zone[:n-1] // AWS: REGIONx
	}
	return zone
}

// Wait holds a request that matched f before the fake answers it: Delay, then for a hang until
// the client gives up (ctx), the fault is cleared or ends (For), or the fake stops (stop).
// Setting or clearing other faults does not release it. It reports whether the fake should go
// on to answer (false: the client is gone or the fake stopped).
func (s *Switch) Wait(ctx context.Context, f Fault, stop <-chan struct{}) bool {
	s.held.Add(1)
	defer s.held.Add(-1)
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		case <-stop:
			return false
		}
	}
	if !f.Hang {
		return true
	}
	var expired <-chan time.Time
	if f.For > 0 {
		t := time.NewTimer(f.For)
		defer t.Stop()
		expired = t.C
	}
	for {
		s.mu.Lock()
		if s.cleared == nil {
			s.cleared = make(chan struct{})
		}
		changed := s.cleared
		s.mu.Unlock()
		if !s.inForce(f) {
			return true // cleared before (or while) this request began waiting
		}
		select {
		case <-ctx.Done():
			return false
		case <-stop:
			return false
		case <-changed:
		case <-expired:
			return ctx.Err() == nil // a client that gave up meanwhile gets nothing
		}
		if ctx.Err() != nil {
			return false
		}
	}
}

// Held is how many requests Wait holds now (hung or delayed): a test knows from it that a
// client's giving up has reached the fake.
func (s *Switch) Held() int { return int(s.held.Load()) }

// Parse reads a fault spec, as `ferry fakecloud --fault` takes them:
//
//	KIND[,zone=Z][,region=R][,ops=A|B][,rate=0.5][,for=60s][,code=C][,delay=2s]
//
// where KIND is an HTTP status (503, 404, 500, ...), "hang", "throttle" or "slow" (which
// needs delay=). Examples: "503", "404,zone=us-central1-f", "hang", "throttle,rate=0.5",
// "503,for=60s".
func Parse(spec string) (Fault, error) {
	parts := strings.Split(strings.TrimSpace(spec), ",")
	var f Fault
	switch kind := parts[0]; kind {
	case "hang":
		f.Hang = true
	case "throttle":
		f.Throttle = true
	case "slow":
	default:
		n, err := strconv.Atoi(kind)
		if err != nil || n < 400 || n > 599 {
			return Fault{}, fmt.Errorf("fault %q: kind must be an HTTP error status (400-599), hang, throttle or slow, got %q", spec, kind)
		}
		f.Status = n
	}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return Fault{}, fmt.Errorf("fault %q: %q is not key=value", spec, kv)
		}
		var err error
		switch k {
		case "zone":
			f.Zone = v
		case "region":
			f.Region = v
		case "ops":
			f.Ops = strings.Split(v, "|")
		case "code":
			f.Code = v
		case "message":
			f.Message = v
		case "rate":
			f.Rate, err = strconv.ParseFloat(v, 64)
			if err == nil && (f.Rate <= 0 || f.Rate > 1) {
				err = fmt.Errorf("must be in (0, 1]")
			}
		case "for":
			f.For, err = time.ParseDuration(v)
		case "delay":
			f.Delay, err = time.ParseDuration(v)
		default:
			return Fault{}, fmt.Errorf("fault %q: unknown key %q (zone, region, ops, code, message, rate, for, delay)", spec, k)
		}
		if err != nil {
			return Fault{}, fmt.Errorf("fault %q: %s: %v", spec, k, err)
		}
	}
	if parts[0] == "slow" && f.Delay <= 0 {
		return Fault{}, fmt.Errorf("fault %q: slow needs delay=DURATION", spec)
	}
	return f, nil
}

// String is the fault as Parse reads it (a Message with a comma in it does not survive the trip).
func (f Fault) String() string {
	var parts []string
	switch {
	case f.Hang:
		parts = append(parts, "hang")
	case f.Throttle:
		parts = append(parts, "throttle")
	case f.Status != 0:
		parts = append(parts, strconv.Itoa(f.Status))
	default:
		parts = append(parts, "slow")
	}
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("zone", f.Zone)
	add("region", f.Region)
	add("ops", strings.Join(f.Ops, "|"))
	add("code", f.Code)
	add("message", f.Message)
	if f.Rate > 0 && f.Rate < 1 {
		add("rate", strconv.FormatFloat(f.Rate, 'g', -1, 64))
	}
	if f.For > 0 {
		add("for", roundFor(f.For).String())
	}
	if f.Delay > 0 {
		add("delay", f.Delay.String())
	}
	return strings.Join(parts, ",")
}

// roundFor shows what is left of a fault in whole seconds, or in milliseconds under a second,
// never as 0s (which Parse would read as "until cleared").
func roundFor(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return max(d.Round(time.Millisecond), time.Millisecond)
}

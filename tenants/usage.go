package tenants

import "time"

// Totals counts use: requests (errors among them: answers that were not 2xx), prompt and
// generated tokens, and their cost in micro-dollars.
type Totals struct {
	Requests   int64 `json:"requests"`
	Errors     int64 `json:"errors,omitempty"`
	Input      int64 `json:"input_tokens"`
	Output     int64 `json:"output_tokens"`
	CostMicros int64 `json:"cost_micros"`
}

// Add adds o to t.
func (t *Totals) Add(o Totals) {
	t.Requests += o.Requests
	t.Errors += o.Errors
	t.Input += o.Input
	t.Output += o.Output
	t.CostMicros += o.CostMicros
}

func (t Totals) minus(o Totals) Totals {
	return Totals{t.Requests - o.Requests, t.Errors - o.Errors, t.Input - o.Input, t.Output - o.Output, t.CostMicros - o.CostMicros}
}

// Zero reports whether t counts nothing.
func (t Totals) Zero() bool { return t == Totals{} }

// Row is one key's use of one model on one service on one UTC day: the unit proxies send to the
// controller, the controller persists (adding rows with the same identity) and `ferry usage`
// reads.
type Row struct {
	KeyID   string `json:"key_id"`
	Team    string `json:"team,omitempty"`
	Service string `json:"service"`
	Model   string `json:"model"`
	Day     Day    `json:"day"`
	Totals
}

// RowID is a row's identity: rows with equal IDs add up.
type RowID struct {
	KeyID, Service, Model string
	Day                   Day
}

func (r *Row) ID() RowID { return RowID{r.KeyID, r.Service, r.Model, r.Day} }

// Day is a UTC calendar day, counted from 1970-01-01.
type Day int32

// DayOf is the UTC day of t.
func DayOf(t time.Time) Day { return Day(t.Unix() / 86400) }

// Start is the day's first instant.
func (d Day) Start() time.Time { return time.Unix(int64(d)*86400, 0).UTC() }

// Month is the day's UTC calendar month, as year×12 + month − 1.
func (d Day) Month() int32 {
	t := d.Start()
	return int32(t.Year())*12 + int32(t.Month()) - 1
}

func (d Day) String() string { return d.Start().Format(time.DateOnly) }

// MarshalText writes a day as 2006-01-02, which a billing export reads without Ferry.
func (d Day) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d *Day) UnmarshalText(b []byte) error {
	t, err := time.Parse(time.DateOnly, string(b))
	if err != nil {
		return err
	}
	*d = DayOf(t)
	return nil
}

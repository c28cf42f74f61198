package optimizer

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/ferryserve/ferry/configs"
	"github.com/ferryserve/ferry/launcher"
)

// WriteTable prints the candidates as `sky launch` prints its optimizer table, one row per
// candidate in failover order, with a ✔ on cands[chosen] (chosen < 0 marks none). Spot
// instances read "g5.xlarge[Spot]". With limit > 0 only the first limit rows are printed
// (plus the chosen row if it is further down) and the rest are summarised as
// "... and 151 more (gcp 147, aws 4)".
func WriteTable(w io.Writer, cands []Candidate, chosen, limit int) error {
	return WriteObjectiveTable(w, cands, chosen, limit, configs.Objective{})
}

// WriteObjectiveTable is WriteTable for a plan ranked by o: with a cost-per-work objective it
// adds the objective's column (each row's score, "-" where it has none) and a line saying
// why the chosen candidate won.
func WriteObjectiveTable(w io.Writer, cands []Candidate, chosen, limit int, o configs.Objective) error {
	shown := len(cands)
	if limit > 0 && limit < shown {
		shown = limit
	}
	header := []string{"INFRA", "INSTANCE", "vCPUs", "Mem(GB)", "GPUS", "REGION/ZONE", "COST ($/hr)", "CHOSEN"}
	capacity := hasCapacity(cands)
	if capacity {
		header = slices.Insert(header, 7, "WAIT", "WINDOW")
	}
	if o.PerWork() {
		header = slices.Insert(header, 7, strings.ToUpper(o.Minimize)+" ("+Unit(o)+")")
	}
	t := newTable(header...)
	row := func(i int) {
		p := &cands[i].Placement
		mark := ""
		if i == chosen {
			mark = "✔"
		}
		cells := []string{p.Infra, instance(p), orDash(p.VCPUs), orDash(p.MemoryGiB), gpus(p), location(p),
			fmt.Sprintf("$ %.2f", p.PricePerHour), mark}
		if capacity {
			cells = slices.Insert(cells, 7, waitCell(&cands[i]), windowCell(p))
		}
		if o.PerWork() {
			cells = slices.Insert(cells, 7, scoreCell(&cands[i]))
		}
		t.row(cells...)
	}
	for i := range shown {
		row(i)
	}
	if chosen >= shown && chosen < len(cands) {
		row(chosen)
	}
	if shown < len(cands) {
		t.line(hidden(cands, shown, chosen))
	}
	if o.PerWork() && chosen >= 0 && chosen < len(cands) {
		t.line(whyChosen(cands, chosen, o))
	}
	return t.flush(w)
}

func scoreCell(c *Candidate) string {
	if !c.Scored {
		return "-"
	}
	return fmt.Sprintf("$ %.4g", c.Score)
}

// whyChosen explains the chosen candidate against the best one of another shape or pricing,
// or says it is own capacity.
func whyChosen(cands []Candidate, chosen int, o configs.Objective) string {
	c := &cands[chosen]
	head := fmt.Sprintf("Objective %s (%s): chose %s", o.Minimize, Unit(o), describePlacement(&c.Placement))
	if tier(&c.Placement) < 2 {
		return head + ": own capacity ranks before priced clouds"
	}
	if !c.Scored {
		return head + ": nothing could be scored (" + c.Why + "), so by price"
	}
	head += fmt.Sprintf(" at $ %.4g (%s)", c.Score, c.Why)
	for i := range cands {
		r := &cands[i]
		if i == chosen || !r.Scored || (r.Placement.Accelerator == c.Placement.Accelerator &&
			r.Placement.AcceleratorCount == c.Placement.AcceleratorCount && r.Placement.Spot == c.Placement.Spot) {
			continue
		}
		return head + fmt.Sprintf(", vs %s at $ %.4g (%s)", describePlacement(&r.Placement), r.Score, r.Why)
	}
	return head
}

func describePlacement(p *launcher.Placement) string {
	s := gpus(p) + " " + instance(p)
	if p.Accelerator == "" {
		s = instance(p)
	}
	return s + " on " + p.Infra
}

// hidden summarises the rows WriteTable leaves out, counted per infra in order of appearance.
func hidden(cands []Candidate, shown, chosen int) string {
	var infras []string
	perInfra := map[string]int{}
	n := 0
	for i := shown; i < len(cands); i++ {
		if i == chosen {
			continue
		}
		name := cands[i].Placement.Infra
		if perInfra[name] == 0 {
			infras = append(infras, name)
		}
		perInfra[name]++
		n++
	}
	parts := make([]string, len(infras))
	for i, name := range infras {
		parts[i] = fmt.Sprintf("%s %d", name, perInfra[name])
	}
	return fmt.Sprintf("... and %d more (%s)", n, strings.Join(parts, ", "))
}

func instance(p *launcher.Placement) string {
	s := p.InstanceType
	if s == "" {
		s = "-"
	}
	switch {
	case p.Spot:
		s += "[Spot]"
	case p.Reservation != "":
		s += "[Reserved " + p.Reservation + "]"
	case p.Queued:
		s += "[Queued]"
	}
	return s
}

func gpus(p *launcher.Placement) string {
	if p.Accelerator == "" {
		return "-"
	}
	s := p.Accelerator + ":" + formatNumber(p.AcceleratorCount)
	if p.Nodes > 0 {
		s = fmt.Sprintf("%d× %s", p.Nodes, s) // a gang shape of its own: nodes × per node
	}
	return s
}

func location(p *launcher.Placement) string {
	switch {
	case p.Region != "" && p.Zone != "":
		return p.Region + "/" + p.Zone
	case p.Region != "":
		return p.Region
	case p.Zone != "":
		return p.Zone
	}
	return "-"
}

func orDash(v float64) string {
	if v == 0 {
		return "-"
	}
	return formatNumber(v)
}

// table aligns columns with tabwriter and trims the padding tabwriter leaves at line ends, so
// output compares cleanly in golden tests and terminals.
type table struct {
	buf bytes.Buffer
	tw  *tabwriter.Writer
}

func newTable(header ...string) *table {
	t := &table{}
	t.tw = tabwriter.NewWriter(&t.buf, 0, 0, 2, ' ', 0)
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if i > 0 {
			t.tw.Write([]byte{'\t'})
		}
		io.WriteString(t.tw, c)
	}
	t.tw.Write([]byte{'\n'})
}

// line writes text that is not part of the columns (it must come after the last row).
func (t *table) line(s string) {
	t.tw.Flush()
	t.buf.WriteString(s)
	t.buf.WriteByte('\n')
}

func (t *table) flush(w io.Writer) error {
	t.tw.Flush()
	lines := bytes.SplitAfter(t.buf.Bytes(), []byte{'\n'})
	var out bytes.Buffer
	out.Grow(t.buf.Len())
	for _, l := range lines {
		if len(l) == 0 {
			continue
		}
		out.Write(bytes.TrimRight(l, " \n"))
		out.WriteByte('\n')
	}
	_, err := w.Write(out.Bytes())
	return err
}

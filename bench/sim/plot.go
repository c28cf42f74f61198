package sim

import (
	"fmt"
	"html"
	"math"
	"strings"
)

// The plot is hand-written SVG: the offered load on top, then one panel per policy with its
// READY replicas stacked by kind (spot below, on-demand above), its target as a line, and a
// red tick at the top for every preemption. All replica panels share one y scale.

const (
	plotWidth    = 1100
	plotLeft     = 70
	plotRight    = 20
	plotTop      = 40
	loadHeight   = 110
	panelHeight  = 95
	panelGap     = 28
	colorSpot    = "#3b7dd8"
	colorOD      = "#f08c2e"
	colorTarget  = "#222222"
	colorLoad    = "#555555"
	colorPreempt = "#d62728"
)

// SVG draws the report's timeline.
func (r *Report) SVG() []byte {
	var b strings.Builder
	n := len(r.Results)
	height := plotTop + loadHeight + panelGap + n*(panelHeight+panelGap) + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		plotWidth, height, plotWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">ferry sim: load and READY replicas per policy (time-scale %.3g, spot traces from +%v)</text>`+"\n",
		plotLeft, r.TimeScale, r.Options.SpotOffset)
	fmt.Fprintf(&b, `<g font-size="11"><rect x="%d" y="26" width="10" height="8" fill="%s"/><text x="%d" y="34">spot READY</text>`,
		plotWidth-480, colorSpot, plotWidth-466)
	fmt.Fprintf(&b, `<rect x="%d" y="26" width="10" height="8" fill="%s"/><text x="%d" y="34">on-demand READY</text>`,
		plotWidth-385, colorOD, plotWidth-371)
	fmt.Fprintf(&b, `<line x1="%d" y1="30" x2="%d" y2="30" stroke="%s" stroke-width="1.2"/><text x="%d" y="34">target (need)</text>`,
		plotWidth-250, plotWidth-230, colorTarget, plotWidth-225)
	fmt.Fprintf(&b, `<line x1="%d" y1="26" x2="%d" y2="35" stroke="%s" stroke-width="1.5"/><text x="%d" y="34">preemption</text></g>`+"\n",
		plotWidth-120, plotWidth-120, colorPreempt, plotWidth-113)

	hours := r.Options.Duration.Hours()
	innerW := float64(plotWidth - plotLeft - plotRight)
	xAt := func(minute float64) float64 { return plotLeft + innerW*minute/(hours*60) }

	// Load panel.
	y0 := float64(plotTop)
	maxLoad := 0.0
	for _, v := range r.loadPerMinute {
		maxLoad = max(maxLoad, v)
	}
	maxLoad = niceCeil(maxLoad)
	r.axes(&b, y0, loadHeight, maxLoad, "req/s (per minute)", xAt, hours)
	var pts []string
	for i, v := range r.loadPerMinute {
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", xAt(float64(i)+0.5), y0+loadHeight-loadHeight*v/maxLoad))
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="0.8" points="%s"/>`+"\n", colorLoad, strings.Join(pts, " "))

	maxRep := 1.0
	for _, res := range r.Results {
		tl := res.timeline
		for i := range tl.target {
			maxRep = max(maxRep, float64(tl.readySpot[i]+tl.readyOnDemand[i]), float64(tl.target[i]))
		}
	}
	maxRep = niceCeil(maxRep)
	for k, res := range r.Results {
		top := y0 + loadHeight + panelGap + float64(k*(panelHeight+panelGap))
		r.axes(&b, top, panelHeight, maxRep, res.Policy+": replicas", xAt, hours)
		tl := res.timeline
		yAt := func(v float64) float64 { return top + panelHeight - panelHeight*v/maxRep }
		spot := make([]float64, len(tl.target))
		total := make([]float64, len(tl.target))
		for i := range tl.target {
			spot[i] = float64(tl.readySpot[i])
			total[i] = float64(tl.readySpot[i] + tl.readyOnDemand[i])
		}
		zero := make([]float64, len(tl.target))
		b.WriteString(area(xAt, yAt, zero, spot, colorSpot))
		b.WriteString(area(xAt, yAt, spot, total, colorOD))
		target := make([]float64, len(tl.target))
		for i, v := range tl.target {
			target[i] = float64(v)
		}
		var line []string
		if len(target) > 0 {
			for _, p := range steps(target, false) {
				line = append(line, fmt.Sprintf("%.1f,%.1f", xAt(p[0]), yAt(p[1])))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1" points="%s"/>`+"\n", colorTarget, strings.Join(line, " "))
		var marks strings.Builder
		for _, at := range tl.preemptions {
			x := xAt(at / 60)
			fmt.Fprintf(&marks, "M%.1f %.1fv8", x, top)
		}
		if marks.Len() > 0 {
			fmt.Fprintf(&b, `<path stroke="%s" stroke-width="1.2" d="%s"/>`+"\n", colorPreempt, marks.String())
		}
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end" fill="#444">SLO %.2f%% · avail %.2f%% · $%.0f · %d preemptions</text>`+"\n",
			plotWidth-plotRight, top-4, 100*res.SLOAttainment, 100*res.Availability, res.Cost, res.Preemptions)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// axes draws a panel's frame, y ticks at 0, half and max, x ticks in hours, and its title.
func (r *Report) axes(b *strings.Builder, top, h, maxY float64, title string, xAt func(float64) float64, hours float64) {
	left, right := float64(plotLeft), float64(plotWidth-plotRight)
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#bbb"/>`+"\n", left, top, right-left, h)
	fmt.Fprintf(b, `<text x="%.0f" y="%.0f" font-weight="bold">%s</text>`+"\n", left, top-4, html.EscapeString(title))
	for _, f := range []float64{0, 0.5, 1} {
		y := top + h - h*f
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`, left-4, y+4, trimFloat(maxY*f))
		if f > 0 {
			fmt.Fprintf(b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`, left, y, right, y)
		}
	}
	step := niceCeil(hours / 12)
	for t := 0.0; t <= hours+1e-9; t += step {
		x := xAt(t * 60)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#bbb"/><text x="%.1f" y="%.0f" text-anchor="middle" fill="#666">%sh</text>`,
			x, top+h, x, top+h+3, x, top+h+14, trimFloat(t))
	}
	b.WriteString("\n")
}

// area is a filled band between lower and upper, one sample per minute, drawn as steps.
func area(xAt func(float64) float64, yAt func(float64) float64, lower, upper []float64, color string) string {
	if len(upper) == 0 {
		return ""
	}
	var d strings.Builder
	fmt.Fprintf(&d, "M%.1f %.1f", xAt(0), yAt(lower[0]))
	for _, p := range steps(upper, false) {
		fmt.Fprintf(&d, "L%.1f %.1f", xAt(p[0]), yAt(p[1]))
	}
	for _, p := range steps(lower, true) {
		fmt.Fprintf(&d, "L%.1f %.1f", xAt(p[0]), yAt(p[1]))
	}
	return fmt.Sprintf(`<path fill="%s" fill-opacity="0.85" stroke="none" d="%sZ"/>`+"\n", color, d.String())
}

// steps returns the corners of a step line through per-minute samples, (minute, value) pairs,
// keeping only the corners where the value changes; reversed runs from the end to the start.
func steps(v []float64, reversed bool) [][2]float64 {
	n := len(v)
	out := [][2]float64{{0, v[0]}}
	for i := 1; i < n; i++ {
		if v[i] != v[i-1] {
			out = append(out, [2]float64{float64(i), v[i-1]}, [2]float64{float64(i), v[i]})
		}
	}
	out = append(out, [2]float64{float64(n), v[n-1]})
	if reversed {
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	}
	return out
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p+1e-9 {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

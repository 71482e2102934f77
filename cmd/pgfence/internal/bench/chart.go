package bench

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The charts of pgfence bench: plain SVG written by this file, so that
// docs/benchmarks.md shows what the command measured without any tool.

type chartSeries struct {
	name   string
	xs, ys []float64
	dashed bool
}

type chartAxis struct {
	label string
	log   bool      // logarithmic
	ticks []float64 // where to put ticks; nil for automatic
}

var chartColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// writeCharts writes the client-scaling and the handoff chart into dir, for
// the scenarios that ran, and returns the files written.
func writeCharts(dir string, r *Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	write := func(name, svg string) error {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(svg), 0o644); err != nil {
			return err
		}
		files = append(files, p)
		return nil
	}
	for _, s := range r.Scenarios {
		switch s.Name {
		case "scaling":
			if svg := scalingChart(s, r); svg != "" {
				if err := write("bench-client-scaling.svg", svg); err != nil {
					return files, err
				}
			}
		case "handoff":
			if svg := handoffChart(s, r); svg != "" {
				if err := write("bench-handoff.svg", svg); err != nil {
					return files, err
				}
			}
		}
	}
	return files, nil
}

func scalingChart(s *ScenarioResult, r *Report) string {
	var grant, hand, guarded, plain chartSeries
	grant.name, hand.name = "grant: gofence Acquire+Release", "grant: hand-written upsert+update"
	guarded.name, plain.name = "UPDATE protected (token column)", "UPDATE unprotected"
	hand.dashed, plain.dashed = true, true
	var ticks []float64
	for _, c := range s.Comparisons {
		x := float64(c.Clients)
		switch c.key.what {
		case cmpGrant:
			ticks = append(ticks, x)
			grant.xs, grant.ys = append(grant.xs, x), append(grant.ys, c.AOps.Median)
			hand.xs, hand.ys = append(hand.xs, x), append(hand.ys, c.BOps.Median)
		case cmpGuardedUpdate:
			guarded.xs, guarded.ys = append(guarded.xs, x), append(guarded.ys, c.AOps.Median)
			plain.xs, plain.ys = append(plain.xs, x), append(plain.ys, c.BOps.Median)
		}
	}
	if len(ticks) == 0 {
		return ""
	}
	title := fmt.Sprintf("Client scaling: median throughput over %d rounds of %s (%d CPUs, %s)",
		r.Settings.Rounds, r.Settings.Duration, r.Machine.CPUs, shortVersion(r.Machine.PostgreSQL))
	return lineChart(title,
		chartAxis{label: "clients", log: len(ticks) > 1, ticks: ticks},
		chartAxis{label: "operations per second"},
		[]chartSeries{grant, hand, guarded, plain})
}

func handoffChart(s *ScenarioResult, r *Report) string {
	var series []chartSeries
	for _, l := range s.Latencies {
		if l.N == 0 {
			continue
		}
		cs := chartSeries{name: fmt.Sprintf("%s (n=%d)", l.Name, l.N)}
		// A CDF, thinned to at most 200 points.
		step := max(1, len(l.Samples)/200)
		for i := 0; i < len(l.Samples); i += step {
			cs.xs = append(cs.xs, max(l.Samples[i], 0.001))
			cs.ys = append(cs.ys, float64(i+1)/float64(len(l.Samples)))
		}
		cs.xs = append(cs.xs, max(l.Samples[len(l.Samples)-1], 0.001))
		cs.ys = append(cs.ys, 1)
		series = append(series, cs)
	}
	if len(series) == 0 {
		return ""
	}
	title := fmt.Sprintf("Lease handoff: release to next grant, %s waiters (%d CPUs, %s)",
		strconv.Itoa(r.Settings.Waiters), r.Machine.CPUs, shortVersion(r.Machine.PostgreSQL))
	return lineChart(title,
		chartAxis{label: "milliseconds (log scale)", log: true},
		chartAxis{label: "fraction of samples at or below", ticks: []float64{0, 0.25, 0.5, 0.75, 0.9, 0.99, 1}},
		series)
}

// shortVersion turns "PostgreSQL 15.2 (Debian ...) on ..." into "PostgreSQL 15.2".
func shortVersion(v string) string {
	f := strings.Fields(v)
	if len(f) >= 2 {
		return f[0] + " " + f[1]
	}
	return v
}

// The chart's fixed measures, in SVG pixels. The view box grows to the right
// for the legend and the title, and the left margin for the y tick labels.
const (
	chartFont      = 12  // font size of tick labels, axis labels and legend
	chartTitleFont = 14  // font size of the (bold) title
	plotWidth      = 490 // the plot's frame
	plotHeight     = 355
	plotTop        = 50 // room for the title
	plotBottom     = 55 // room for the x tick labels and the x axis label
	yLabelRoom     = 32 // left of the y tick labels: the rotated y axis label
	legendRow      = 22 // distance between legend entries
	legendText     = 42 // from the plot's right edge to a legend entry's text
	tickGap        = 6  // between a tick label and the plot or the next label
)

// lineChart draws series as lines with markers on one plot, with a legend
// right of it. Tick labels that would print over their neighbour are left
// out (their grid lines stay), and the view box is as wide as the legend
// and the title need, measured by textWidth.
func lineChart(title string, xa, ya chartAxis, series []chartSeries) string {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for i := range s.xs {
			xmin, xmax = math.Min(xmin, s.xs[i]), math.Max(xmax, s.xs[i])
			ymin, ymax = math.Min(ymin, s.ys[i]), math.Max(ymax, s.ys[i])
		}
	}
	xt := xa.ticks
	if xa.log {
		if xt == nil {
			xt = decadeTicks(xmin, xmax)
		}
		xmin, xmax = math.Min(xmin, xt[0]), math.Max(xmax, xt[len(xt)-1])
	} else if xt == nil {
		xmin = 0
		xt = niceTicks(xmax)
		xmax = xt[len(xt)-1]
	}
	yt := ya.ticks
	if yt == nil {
		ymin = 0
		yt = niceTicks(ymax)
		ymax = yt[len(yt)-1]
	} else {
		ymin, ymax = math.Min(ymin, yt[0]), math.Max(ymax, yt[len(yt)-1])
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax == ymin {
		ymax = ymin + 1
	}
	xLabels, yLabels := tickLabels(xt), tickLabels(yt)

	// Margins: the widest y tick label, the widest legend entry, the title.
	left := 80.0
	for _, l := range yLabels {
		left = math.Max(left, yLabelRoom+textWidth(l, chartFont, false)+tickGap)
	}
	w := left + plotWidth + legendText
	for _, s := range series {
		w = math.Max(w, left+plotWidth+legendText+textWidth(s.name, chartFont, false)+10)
	}
	w = math.Ceil(math.Max(w, left+textWidth(title, chartTitleFont, true)+10))
	h := math.Max(plotTop+plotHeight+plotBottom, plotTop+10+legendRow*float64(len(series))+10)
	pw, ph := float64(plotWidth), float64(plotHeight)
	right, bottom := left+pw, plotTop+ph

	px := func(x float64) float64 {
		if xa.log {
			return left + pw*(math.Log(x)-math.Log(xmin))/(math.Log(xmax)-math.Log(xmin))
		}
		return left + pw*(x-xmin)/(xmax-xmin)
	}
	py := func(y float64) float64 { return plotTop + ph*(1-(y-ymin)/(ymax-ymin)) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="%d">`+"\n", w, h, w, h, chartFont)
	fmt.Fprintf(&b, `<rect width="%.0f" height="%.0f" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="24" font-size="%d" font-weight="bold">%s</text>`+"\n", left, chartTitleFont, html.EscapeString(title))
	lastEnd := math.Inf(-1) // right end of the last x tick label drawn
	for i, x := range xt {
		X := px(x)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", X, plotTop, X, bottom)
		half := textWidth(xLabels[i], chartFont, false) / 2
		if X-half < lastEnd+tickGap {
			continue // it would print over the previous label
		}
		lastEnd = X + half
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", X, bottom+16, xLabels[i])
	}
	lastY := math.Inf(1) // baseline of the last y tick label drawn
	for i, y := range yt {
		Y := py(y)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#ddd"/>`+"\n", left, Y, right, Y)
		if lastY-(Y+4) < chartFont+2 {
			continue // it would print over the previous label
		}
		lastY = Y + 4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-tickGap, Y+4, yLabels[i])
	}
	fmt.Fprintf(&b, `<rect x="%.0f" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, plotTop, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", left+pw/2, h-12, html.EscapeString(xa.label))
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", plotTop+ph/2, html.EscapeString(ya.label))
	for i, s := range series {
		color := chartColors[i%len(chartColors)]
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for j := range s.xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[j]), py(s.ys[j])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
		if len(s.xs) <= 20 {
			for j := range s.xs {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(s.xs[j]), py(s.ys[j]), color)
			}
		}
		ly := plotTop + 10 + legendRow*i
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%d" x2="%.0f" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", right+12, ly, right+36, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%.0f" y="%d">%s</text>`+"\n", right+legendText, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// textWidth is the width of s drawn at size in pixels, estimated on the
// wide side (above DejaVu Sans, wider than the sans-serif of most
// browsers), so that what is laid out by it fits.
func textWidth(s string, size float64, bold bool) float64 {
	em := 0.0
	for _, r := range s {
		switch {
		case strings.ContainsRune("ijlI.,:;'|!()[]{} ", r):
			em += 0.42
		case strings.ContainsRune("mwMW@%", r):
			em += 1.05
		case strings.ContainsRune("=+<>~#&", r):
			em += 0.9
		case r >= 'A' && r <= 'Z':
			em += 0.82
		default:
			em += 0.66
		}
	}
	if bold {
		em *= 1.1
	}
	return em * size
}

// niceTicks gives 0 and about five round steps up to at least top.
func niceTicks(top float64) []float64 {
	if top <= 0 {
		return []float64{0, 1}
	}
	raw := top / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var t []float64
	for v := 0.0; v < top+step; v += step {
		t = append(t, v)
		if v >= top {
			break
		}
	}
	return t
}

// decadeTicks gives 1, 2, 5 times powers of ten around [lo, hi].
func decadeTicks(lo, hi float64) []float64 {
	lo = math.Max(lo, 1e-3)
	var t []float64
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo/2 && v <= hi*2 {
				t = append(t, v)
			}
		}
	}
	if len(t) == 0 {
		t = []float64{lo, hi}
	}
	return t
}

// tickLabels labels an axis's ticks; on an axis that reaches 10 000 every
// tick from 1 000 up is in thousands ("5k", "10k"), not "5000" beside "10k".
func tickLabels(ticks []float64) []string {
	k := len(ticks) > 0 && slices.Max(ticks) >= 10000
	labels := make([]string, len(ticks))
	for i, v := range ticks {
		switch {
		case k && v >= 1000:
			labels[i] = strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
		case v == math.Trunc(v):
			labels[i] = strconv.FormatFloat(v, 'f', 0, 64)
		default:
			labels[i] = strconv.FormatFloat(v, 'g', 3, 64)
		}
	}
	return labels
}

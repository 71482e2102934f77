package bench

import (
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sampleChartReport is a report with every scenario that draws a chart,
// its series named as the bench names them.
func sampleChartReport() *Report {
	r := &Report{
		Machine:  Machine{CPUs: 2, PostgreSQL: "PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu"},
		Settings: Settings{Duration: "300ms", Rounds: 3, Waiters: 4},
	}
	scaling := &ScenarioResult{Name: "scaling"}
	for i, clients := range []int{1, 2, 4, 8, 16, 32} {
		grant := 1300 + 500*float64(i)
		update := 2900 + 1500*float64(i)
		scaling.Comparisons = append(scaling.Comparisons,
			&Comparison{key: cmpKey{what: cmpGrant, clients: clients}, Name: "grant", Clients: clients, AOps: Summary{Median: grant}, BOps: Summary{Median: grant * 1.4}},
			&Comparison{key: cmpKey{what: cmpGuardedUpdate, clients: clients}, Name: "guarded UPDATE", Clients: clients, AOps: Summary{Median: update}, BOps: Summary{Median: update * 1.3}})
	}
	handoff := &ScenarioResult{Name: "handoff"}
	for _, l := range []struct {
		name   string
		n      int
		median float64 // ms
	}{
		{"handoff with NOTIFY", 349, 1.05},
		{"handoff polling only (PollInterval 100ms)", 31, 34},
		{"round trip (SELECT 1)", 18569, 0.028},
		{"one synchronous commit (1-row UPDATE)", 3089, 0.275},
	} {
		// A skewed distribution with a long tail, sorted.
		samples := make([]float64, l.n)
		for i := range samples {
			q := (float64(i) + 0.5) / float64(l.n)
			samples[i] = l.median * math.Exp(0.5*math.Log(q/(1-q)))
		}
		handoff.Latencies = append(handoff.Latencies, Latency{Name: l.name, N: l.n, Samples: samples})
	}
	r.Scenarios = []*ScenarioResult{scaling, handoff}
	return r
}

// TestChartLayout renders every chart kind from sample data, and checks the
// charts in docs/, for what a reader would see: no two y tick labels closer
// than the font height, no two x tick labels over each other, and every text
// (title, tick labels, legend) inside the view box, widths measured
// conservatively.
func TestChartLayout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	files, err := writeCharts(dir, sampleChartReport())
	require.NoError(t, err)
	require.Len(t, files, 2, "one chart per kind")
	docs, err := filepath.Glob(filepath.Join("..", "..", "..", "..", "docs", "*.svg"))
	require.NoError(t, err)
	require.NotEmpty(t, docs, "the charts in docs/")
	for _, f := range append(files, docs...) {
		svg, err := os.ReadFile(f)
		require.NoError(t, err)
		t.Run(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), func(t *testing.T) {
			checkChartLayout(t, svg)
		})
	}
}

// svgText is a <text> of a chart, with where it stands.
type svgText struct {
	x, y, size float64
	anchor     string
	bold       bool
	rotated    bool
	s          string
}

// extent is the horizontal span of the text, its width measured
// conservatively.
func (t svgText) extent() (float64, float64) {
	w := textWidth(t.s, t.size, t.bold)
	switch t.anchor {
	case "end":
		return t.x - w, t.x
	case "middle":
		return t.x - w/2, t.x + w/2
	}
	return t.x, t.x + w
}

func checkChartLayout(t *testing.T, svg []byte) {
	t.Helper()
	var width, height, fontSize float64
	var frame struct{ x0, y0, x1, y1 float64 }
	var texts []svgText
	d := xml.NewDecoder(strings.NewReader(string(svg)))
	var open *svgText
	for {
		tok, err := d.Token()
		if err != nil {
			break
		}
		switch e := tok.(type) {
		case xml.StartElement:
			a := map[string]string{}
			for _, at := range e.Attr {
				a[at.Name.Local] = at.Value
			}
			num := func(k string) float64 {
				v, err := strconv.ParseFloat(a[k], 64)
				require.NoError(t, err, "%s=%q of <%s>", k, a[k], e.Name.Local)
				return v
			}
			switch e.Name.Local {
			case "svg":
				_, err := fmt.Sscanf(a["viewBox"], "0 0 %g %g", &width, &height)
				require.NoError(t, err, "viewBox %q", a["viewBox"])
				fontSize = num("font-size")
			case "rect":
				if a["fill"] == "none" { // the plot's frame
					frame.x0, frame.y0 = num("x"), num("y")
					frame.x1, frame.y1 = frame.x0+num("width"), frame.y0+num("height")
				}
			case "line":
				for _, k := range []string{"x1", "x2"} {
					require.True(t, num(k) >= 0 && num(k) <= width, "a line leaves the view box: %s=%v, width %v", k, num(k), width)
				}
			case "text":
				tx := svgText{size: fontSize, anchor: a["text-anchor"], bold: a["font-weight"] == "bold"}
				if a["font-size"] != "" {
					tx.size = num("font-size")
				}
				if tr := a["transform"]; tr != "" {
					tx.rotated = true
					_, err := fmt.Sscanf(tr, "translate(%g %g)", &tx.x, &tx.y)
					require.NoError(t, err, "transform %q", tr)
				} else {
					tx.x, tx.y = num("x"), num("y")
				}
				open = &tx
			}
		case xml.CharData:
			if open != nil {
				open.s += string(e)
			}
		case xml.EndElement:
			if e.Name.Local == "text" && open != nil {
				texts = append(texts, *open)
				open = nil
			}
		}
	}
	require.Positive(t, width)
	require.Positive(t, frame.x1, "the plot's frame")

	var yTicks, xTicks []svgText
	for _, tx := range texts {
		switch {
		case tx.rotated: // the y axis label, written upwards
			require.True(t, tx.x-tx.size >= 0 && tx.y >= 0 && tx.y <= height, "y axis label %q outside the view box", tx.s)
			continue
		case tx.anchor == "end":
			yTicks = append(yTicks, tx)
		case tx.anchor == "middle" && tx.y > frame.y1 && tx.y < frame.y1+2*tx.size:
			xTicks = append(xTicks, tx)
		}
		x0, x1 := tx.extent()
		require.True(t, x0 >= 0 && x1 <= width && tx.y-tx.size >= 0 && tx.y <= height,
			"%q spans x %.0f-%.0f, y %.0f-%.0f: outside the view box 0 0 %v %v", tx.s, x0, x1, tx.y-tx.size, tx.y, width, height)
		if tx.x > frame.x1 { // the legend
			require.True(t, x1 <= width, "legend entry %q is cut off at the right edge", tx.s)
		}
	}
	require.NotEmpty(t, yTicks)
	require.NotEmpty(t, xTicks)
	slices.SortFunc(yTicks, func(a, b svgText) int { return int(math.Copysign(1, a.y-b.y)) })
	for i := 1; i < len(yTicks); i++ {
		gap := yTicks[i].y - yTicks[i-1].y
		require.GreaterOrEqual(t, gap, yTicks[i].size, "y tick labels %q and %q print over each other", yTicks[i-1].s, yTicks[i].s)
	}
	for _, tx := range yTicks {
		_, x1 := tx.extent()
		require.LessOrEqual(t, x1, frame.x0, "y tick label %q runs into the plot", tx.s)
	}
	slices.SortFunc(xTicks, func(a, b svgText) int { return int(math.Copysign(1, a.x-b.x)) })
	for i := 1; i < len(xTicks); i++ {
		_, prevEnd := xTicks[i-1].extent()
		start, _ := xTicks[i].extent()
		require.LessOrEqual(t, prevEnd, start, "x tick labels %q and %q print over each other", xTicks[i-1].s, xTicks[i].s)
	}
}

// TestTextWidthIsConservative holds the width estimate above what
// rsvg-convert draws with DejaVu Sans (a wide sans-serif) at 12px, measured
// once for these strings.
func TestTextWidthIsConservative(t *testing.T) {
	t.Parallel()
	for s, drawn := range map[string]float64{
		"one synchronous commit (1-row UPDATE) (n=12345)":  318,
		"handoff polling only (PollInterval 100ms) (n=61)": 289,
		"grant: hand-written upsert+update":                212,
		"UPDATE protected (token column)":                  203,
		"WWWWWWWWWW":                                       119,
		"MMMMMMMMMM":                                       103,
		"mmmmmmmmmm":                                       116,
		"@@@@@@@@@@":                                       120,
		"%%%%%%%%%%":                                       114,
		"1000000":                                          53,
		"0.99":                                             26,
	} {
		require.GreaterOrEqual(t, textWidth(s, 12, false), drawn, s)
	}
}

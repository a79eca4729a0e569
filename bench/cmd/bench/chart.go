package main

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// chart draws grouped bars, one group per workload and one bar per system, of msg/s on a
// log scale. gonum's log scale cannot draw bars from zero, so each bar's height is
// log10(rate) − base on a linear axis labelled in msg/s.
func (r *report) chart(path string) error {
	type cat struct{ label, caseID, metric string }
	var cats []cat
	for _, c := range r.cases {
		switch c.Workload {
		case "W1", "W2":
			cats = append(cats, cat{c.ID, c.ID, "rate"})
		case "W3":
			cats = append(cats, cat{"W3 publish", c.ID, "publish_rate"}, cat{"W3 drain", c.ID, "drain_rate"})
		case "W4":
			cats = append(cats, cat{"W4 requeue", c.ID, "requeue_rate"})
		case "S1", "S2", "D1", "D2", "D3":
			cats = append(cats, cat{c.ID, c.ID, "rate"})
		}
	}
	if len(cats) == 0 {
		return nil
	}
	labels := make([]string, len(cats))
	for i, c := range cats {
		labels[i] = c.label
	}
	// The bottom of the axis: bars start at 1k msg/s, or at the power of ten below the slowest
	// rate when one is under 1k (the durable suite's fsync-bound cells).
	chartBase := 3.0
	for _, s := range r.systems {
		for _, c := range cats {
			if v, ok := r.cells[key{s, c.caseID}].median(c.metric); ok && v > 0 {
				chartBase = math.Min(chartBase, math.Floor(math.Log10(v)))
			}
		}
	}
	p := plot.New()
	p.Title.Text = "warren and peers: messages per second (log scale; S1 = publish + consume + ack at that depth; S2 = publish + route)"
	if !r.hasWorkload("W2", "W3", "W4", "S1", "S2") {
		p.Title.Text = "durable systems: msg/s (log scale)"
	}
	p.Y.Label.Text = "msg/s"
	p.Y.Min = 0
	top := 0.0
	n := len(r.systems)
	w := vg.Points(float64(min(12, 110/n)))
	for i, s := range r.systems {
		vals := make(plotter.Values, len(cats))
		for j, c := range cats {
			if v, ok := r.cells[key{s, c.caseID}].median(c.metric); ok && v > 0 {
				vals[j] = math.Max(0, math.Log10(v)-chartBase)
				top = math.Max(top, vals[j])
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.LineStyle.Width = vg.Length(0)
		bars.Color = plotutil.Color(i)
		// The channel baselines in greys, darkest the minimal one.
		if g, ok := map[string]uint8{"chan-min": 40, "chan-min-unbounded": 90, "chan": 150}[s]; ok {
			bars.Color = color.Gray{Y: g}
		}
		bars.Offset = vg.Length(float64(i)-float64(n-1)/2) * w
		p.Add(bars)
		p.Legend.Add(s, bars)
	}
	p.Legend.Top = true
	p.Legend.Left = false
	p.Y.Max = top + math.Max(0.6, 0.17*float64(n)) // room for the legend, a line per system
	var ticks plot.ConstantTicks
	for e := 0.0; e <= p.Y.Max; e++ {
		ticks = append(ticks, plot.Tick{Value: e, Label: rateLabel(e + chartBase)})
		for _, m := range []float64{2, 5} {
			if e+math.Log10(m) <= p.Y.Max {
				ticks = append(ticks, plot.Tick{Value: e + math.Log10(m)})
			}
		}
	}
	p.Y.Tick.Marker = ticks
	p.NominalX(labels...)
	p.Add(plotter.NewGrid())
	return p.Save(vg.Length(float64(len(cats))*float64(n)*float64(w)/float64(vg.Inch)*1.35+2)*vg.Inch, 6*vg.Inch, path)
}

func rateLabel(exp float64) string {
	switch e := int(math.Round(exp)); {
	case e >= 6:
		return fmt.Sprintf("%gM", math.Pow(10, float64(e-6)))
	case e >= 3:
		return fmt.Sprintf("%gk", math.Pow(10, float64(e-3)))
	default:
		return fmt.Sprintf("%g", math.Pow(10, float64(e)))
	}
}

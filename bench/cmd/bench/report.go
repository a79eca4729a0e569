package main

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenmq/warren/bench"
)

type key struct{ system, caseID string }

type cell struct {
	runs []bench.Result
	na   string // the system cannot do this workload meaningfully
	skip string // not run here (flag, unavailable system)
}

func (c *cell) ok() []bench.Result {
	var out []bench.Result
	for _, r := range c.runs {
		if r.OK {
			out = append(out, r)
		}
	}
	return out
}

func (c *cell) failures() []bench.Result {
	var out []bench.Result
	for _, r := range c.runs {
		if !r.OK && r.Skipped == "" {
			out = append(out, r)
		}
	}
	return out
}

// median of a metric over the successful runs; false when there is none, or when any run
// failed (a failed run makes the cell FAIL).
func (c *cell) median(metric string) (float64, bool) {
	if c == nil || len(c.failures()) > 0 {
		return 0, false
	}
	var vs []float64
	for _, r := range c.ok() {
		if v, ok := r.Metrics[metric]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, false
	}
	return median(vs), true
}

func (c *cell) medianRSS() (float64, bool) {
	if c == nil || len(c.failures()) > 0 {
		return 0, false
	}
	var vs []float64
	for _, r := range c.ok() {
		vs = append(vs, float64(r.PeakRSS))
	}
	if len(vs) == 0 {
		return 0, false
	}
	return median(vs), true
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

type machine struct {
	CPUs       int    `json:"cpus"`
	CPU        string `json:"cpu"`
	RAM        string `json:"ram"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	Date       string `json:"date"`
	RabbitMQ   string `json:"rabbitmq,omitempty"`
	TempFS     string `json:"durable_dir,omitempty"`   // where the durable systems' directories are, and its file system
	LoadStart  string `json:"loadavg_start,omitempty"` // /proc/loadavg's 1, 5 and 15 minute averages when the run started
	LoadEnd    string `json:"loadavg_end,omitempty"`   // … and when it ended: the machine is shared
	Deps       string `json:"deps"`
	GOMAXPROCS int    `json:"gomaxprocs"`
}

// loadAvg is /proc/loadavg's 1, 5 and 15 minute load averages, or "".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func describeMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Go: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), LoadStart: loadAvg()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == "MemTotal" {
				if kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64); err == nil {
					m.RAM = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		var deps []string
		for _, d := range bi.Deps {
			for _, p := range []string{"github.com/ThreeDotsLabs/watermill", "github.com/nats-io/nats-server/v2", "github.com/nats-io/nats.go", "github.com/rabbitmq/amqp091-go"} {
				if d.Path == p {
					deps = append(deps, d.Path+" "+d.Version)
				}
			}
		}
		m.Deps = strings.Join(deps, ", ")
	}
	return m
}

func rabbitVersion() string { return bench.RabbitVersion() }

// tempFS says where the durable systems make their directories, and on what file system.
func tempFS() string {
	dir := bench.DurableDir
	if dir == "" {
		dir = os.TempDir()
	}
	return dir + " (" + bench.FSType(dir) + ")"
}

type report struct {
	o        options
	systems  []string
	cases    []bench.Case
	cells    map[key]*cell
	scaled   map[string]float64
	machine  machine
	elapsed  time.Duration
	command  string
	notes    []string // footnote texts; marker i+1
	sysSkips map[string]string
}

func newReport(o options, systems []string, cases []bench.Case) *report {
	return &report{o: o, systems: systems, cases: cases, cells: map[key]*cell{}, scaled: map[string]float64{}, sysSkips: map[string]string{}}
}

func (r *report) cell(system, caseID string) *cell {
	k := key{system, caseID}
	c, ok := r.cells[k]
	if !ok {
		c = &cell{}
		r.cells[k] = c
	}
	return c
}

func (r *report) add(res bench.Result) {
	c := r.cell(res.System, res.Case)
	if res.Skipped != "" {
		c.skip = res.Skipped
		return
	}
	c.runs = append(c.runs, res)
}

func (r *report) na(system, caseID, why string)   { r.cell(system, caseID).na = why }
func (r *report) skip(system, caseID, why string) { r.cell(system, caseID).skip = why }

func (r *report) skipSystem(system, why string) {
	r.sysSkips[system] = why
	for _, c := range r.cases {
		cl := r.cell(system, c.ID)
		if cl.na == "" && len(cl.runs) == 0 {
			cl.skip = why
		}
	}
}

func (r *report) skipped(system, caseID string) bool {
	c, ok := r.cells[key{system, caseID}]
	return ok && c.skip != ""
}

// note returns the footnote marker for text, adding it once.
func (r *report) note(text string) string {
	i := slices.Index(r.notes, text)
	if i < 0 {
		r.notes = append(r.notes, text)
		i = len(r.notes) - 1
	}
	return fmt.Sprintf("[^%d]", i+1)
}

// ---- formatting ----

func fmtRate(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2f M/s", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0f k/s", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.1f k/s", v/1e3)
	}
	return fmt.Sprintf("%.0f /s", v)
}

func fmtNs(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2f ms", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1f µs", v/1e3)
	}
	return fmt.Sprintf("%.0f ns", v)
}

func fmtMs(v float64) string {
	if v >= 100 {
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

func fmtMB(b float64) string { return fmt.Sprintf("%.0f MB", b/(1<<20)) }

func fmtRatio(v float64) string {
	switch {
	case v < 0.01:
		return fmt.Sprintf("%.2g×", v) // two significant digits
	case v >= 100:
		return fmt.Sprintf("%.0f×", v)
	case v >= 10:
		return fmt.Sprintf("%.1f×", v)
	}
	return fmt.Sprintf("%.2f×", v)
}

// fmtTargetRatio shows enough digits that a ratio just under a threshold does not print as it.
func fmtTargetRatio(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.1f×", v)
	}
	return fmt.Sprintf("%.3f×", v)
}

func fmtAllocs(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// ---- rows ----

// row is one line of the main table: a case's metric. higher says which way is better;
// the ratio to the baseline is always expressed as throughput (above 1: faster than it).
type row struct {
	label, caseID, metric string
	kind                  string // rate, ns, ms
}

func (r *report) rows() []row {
	var rows []row
	has := func(id string) bool {
		return slices.ContainsFunc(r.cases, func(c bench.Case) bool { return c.ID == id })
	}
	title := func(id string) string {
		for _, c := range r.cases {
			if c.ID == id {
				return c.Title
			}
		}
		return id
	}
	if has("W1") {
		rows = append(rows, row{"W1 handoff (1→1, ack each), msg/s", "W1", "rate", "rate"})
	}
	if has("W2") {
		rows = append(rows, row{"W2 fan-in (4→4, prefetch 256), msg/s", "W2", "rate", "rate"})
	}
	if has("W3") {
		rows = append(rows, row{"W3 backlog: publish, msg/s", "W3", "publish_rate", "rate"},
			row{"W3 backlog: drain (consume + ack), msg/s", "W3", "drain_rate", "rate"})
	}
	if has("W4") {
		rows = append(rows, row{"W4 requeue: return the held unacked → all back (order after)", "W4", "requeue_ms", "ms"})
	}
	for _, c := range r.cases {
		if c.Workload == "S1" {
			rows = append(rows, row{"S1 publish, ns/msg, " + strings.TrimPrefix(title(c.ID), "S1 "), c.ID, "publish_ns", "ns"})
		}
	}
	for _, c := range r.cases {
		if c.Workload == "S1" {
			rows = append(rows, row{"S1 consume + ack, ns/msg, " + strings.TrimPrefix(title(c.ID), "S1 "), c.ID, "consume_ns", "ns"})
		}
	}
	for _, c := range r.cases {
		if c.Workload == "S2" {
			rows = append(rows, row{"S2 publish + route, ns/msg, " + strings.TrimPrefix(title(c.ID), "S2 "), c.ID, "route_ns", "ns"})
		}
	}
	if has("D1") {
		rows = append(rows, row{"D1 group commit (64 publishers each waiting for every confirm → 1 consumer), msg/s", "D1", "rate", "rate"})
	}
	for _, c := range r.cases {
		if c.Workload == "D2" {
			rows = append(rows, row{fmt.Sprintf("D2 PublishBatch of %d (1 publisher → 1 consumer), msg/s", c.Batch), c.ID, "rate", "rate"})
		}
	}
	if has("D3") {
		rows = append(rows, row{"D3 confirm each (1 publisher waiting for every confirm → 1 consumer), msg/s", "D3", "rate", "rate"})
	}
	return rows
}

// channelBase is the in-memory suite's baseline, the system its ratios and targets are
// against: chan-min, a channel of the body alone, which is what a Go developer would write; else
// chan, a channel of *warren.Message, for a run without chan-min (and results from before it).
// "" when the run has neither (the durable suite).
func (r *report) channelBase() string {
	for _, s := range []string{"chan-min", "chan"} {
		if slices.Contains(r.systems, s) {
			return s
		}
	}
	return ""
}

// durable says whether the named system is one of the durable suite's.
func durable(system string) bool {
	spec, _ := bench.Lookup(system)
	return spec.Durable
}

// hasDurable says whether the report has a durable system.
func (r *report) hasDurable() bool { return slices.ContainsFunc(r.systems, durable) }

// hasWorkload says whether the report has a case of any of the workloads.
func (r *report) hasWorkload(workloads ...string) bool {
	return slices.ContainsFunc(r.cases, func(c bench.Case) bool { return slices.Contains(workloads, c.Workload) })
}

func (r *report) value(system string, rw row) (float64, bool) {
	return r.cells[key{system, rw.caseID}].median(rw.metric)
}

// throughputRatio is a's throughput over b's for the row's metric.
func throughputRatio(kind string, a, b float64) float64 {
	if kind == "rate" {
		return a / b
	}
	return b / a // ns, ms: time per message or per operation
}

func fmtValue(kind string, v float64) string {
	switch kind {
	case "rate":
		return fmtRate(v)
	case "ns":
		return fmtNs(v)
	case "ms":
		return fmtMs(v)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// status is the text of a cell that has no value: n/a, skipped or FAIL, with its footnote.
func (r *report) status(system, caseID string) string {
	c := r.cells[key{system, caseID}]
	switch {
	case c == nil:
		return "—"
	case c.na != "":
		workload, _, _ := strings.Cut(caseID, "/")
		return "n/a" + r.note(system+", "+workload+": "+c.na+".")
	case c.skip != "":
		if why, ok := r.sysSkips[system]; ok && why == c.skip {
			return "skipped" + r.note(system+": "+c.skip+".")
		}
		return "skipped" + r.note(caseID+": "+c.skip+".")
	}
	if f := c.failures(); len(f) > 0 {
		return "FAIL" + r.note(fmt.Sprintf("%s, %s: %d of %d runs failed; first: %s", system, caseID, len(f), len(c.runs), f[0].Error))
	}
	return "—"
}

func (r *report) markdown() string {
	var b strings.Builder
	m := r.machine
	if r.hasDurable() && r.channelBase() == "" {
		b.WriteString("## Results of the durable suite\n\n")
	} else {
		b.WriteString("## Results\n\n")
	}
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s RAM, %s, %s, %s. ", m.CPUs, m.CPU, m.RAM, m.Kernel, m.Go, m.Date)
	if m.RabbitMQ != "" {
		fmt.Fprintf(&b, "RabbitMQ %s. ", m.RabbitMQ)
	}
	if m.TempFS != "" {
		fmt.Fprintf(&b, "Durable systems' directories in %s. ", m.TempFS)
	}
	if m.LoadStart != "" && m.LoadEnd != "" {
		fmt.Fprintf(&b, "Load average (1, 5, 15 min) at the start %s, at the end %s. ", m.LoadStart, m.LoadEnd)
	}
	fmt.Fprintf(&b, "Modules: %s.\n\n", m.Deps)
	fmt.Fprintf(&b, "Command: `%s` (%d fresh-process run(s) per cell, medians", r.command, r.o.runs)
	if r.elapsed > 0 {
		fmt.Fprintf(&b, "; %s in all", r.elapsed.Round(time.Second))
	}
	b.WriteString(").\n\n")
	sz := sizes(r.o.quick, 1)
	if !r.hasWorkload("W2", "W3", "W4", "S1", "S2") && r.hasWorkload("W1") {
		fmt.Fprintf(&b, "Sizes: W1 %d messages, prefetch %d; 128-byte bodies.\n\n", sz.W1, sz.Prefetch)
	} else if r.hasWorkload("W1", "W2", "W3", "W4", "S1", "S2") {
		fmt.Fprintf(&b, "Sizes: W1 %d, W2 %d (%d producers, %d consumers), W3 %d messages; W1/W2 bound (chan-min and chan capacity, warren-block MaxLength) %d, prefetch %d; W4 %d unacked returned into %d; S1 %d messages measured in batches of %d at each depth; S2 %d messages; 128-byte bodies.\n\n",
			sz.W1, sz.W2, sz.W2Producers, sz.W2Producers, sz.W3, sz.W1W2Window, sz.Prefetch, sz.W4Requeue, sz.W4Queue, sz.S1Measure, sz.S1Batch, sz.S2Messages)
	}
	if r.hasWorkload("D1", "D2", "D3") {
		fmt.Fprintf(&b, "Durable sizes: D1 %d messages (%d publishers, each waiting for every confirm, %d consumer(s)), D2 %d messages (1 publisher, 1 consumer), D3 %d messages (1 publisher waiting for every confirm, 1 consumer); prefetch %d; 128-byte bodies.\n\n",
			sz.D1, sz.D1Producers, sz.D1Consumers, sz.D2, sz.D3, sz.Prefetch)
	}
	for _, k := range slices.Sorted(maps.Keys(r.scaled)) {
		f := r.scaled[k]
		s, workload, _ := strings.Cut(k, "/")
		ran := false
		for kk, c := range r.cells {
			w, _, _ := strings.Cut(kk.caseID, "/")
			ran = ran || (kk.system == s && (workload == "" || w == workload) && len(c.runs) > 0)
		}
		if !ran {
			continue
		}
		sz := sizes(r.o.quick, f)
		what := map[string]string{
			"W1": fmt.Sprintf("W1 %d", sz.W1), "W2": fmt.Sprintf("W2 %d", sz.W2), "W3": fmt.Sprintf("W3 %d", sz.W3),
			"S1": fmt.Sprintf("S1 %d measured at each depth", sz.S1Measure), "S2": fmt.Sprintf("S2 %d", sz.S2Messages),
			"D1": fmt.Sprintf("D1 %d", sz.D1), "D2": fmt.Sprintf("D2 %d", sz.D2), "D3": fmt.Sprintf("D3 %d", sz.D3),
		}
		ranWorkload := func(w string) bool {
			for kk, c := range r.cells {
				if cw, _, _ := strings.Cut(kk.caseID, "/"); kk.system == s && cw == w && len(c.runs) > 0 {
					return true
				}
			}
			return false
		}
		var parts []string
		for _, w := range []string{"W1", "W2", "W3", "S1", "S2", "D1", "D2", "D3"} {
			if (workload == "" || workload == w) && ranWorkload(w) {
				if _, own := r.scaled[s+"/"+w]; workload == "" && own {
					continue // its own entry says it
				}
				parts = append(parts, what[w])
			}
		}
		if len(parts) == 0 {
			continue
		}
		fmt.Fprintf(&b, "Reduced sizes for %s%s: %s messages.\n\n", k,
			r.note(fmt.Sprintf("%s ran with reduced sizes (-scale %s=%g) to keep the run's length reasonable on this 2-core machine; rates are per message and comparable, but a smaller run has less GC and memory pressure (and, on a disk, less file to write), which flatters it if anything.", k, k, f)),
			strings.Join(parts, ", "))
	}

	// Main table. Its cells carry the throughput relative to a baseline: the minimal channel
	// (channelBase), or in the durable suite, which has no channel, warren in memory.
	base := r.channelBase()
	switch {
	case base != "":
		what := map[string]string{"chan-min": "the minimal channel", "chan": "the channel of `*warren.Message`"}[base]
		fmt.Fprintf(&b, "### Throughput and cost (× %s = throughput relative to %s)\n\n", base, what)
	case slices.Contains(r.systems, "warren") && r.hasDurable():
		base = "warren"
		b.WriteString("### Throughput and cost (× warren = throughput relative to warren in memory, run alongside)\n\n")
	default:
		b.WriteString("### Throughput and cost\n\n")
	}
	r.header(&b, "Workload")
	for _, rw := range r.rows() {
		fmt.Fprintf(&b, "| %s |", rw.label)
		baseV, baseOK := r.value(base, rw)
		for _, s := range r.systems {
			v, ok := r.value(s, rw)
			if !ok {
				fmt.Fprintf(&b, " %s |", r.status(s, rw.caseID))
				continue
			}
			cellText := fmtValue(rw.kind, v)
			if rw.caseID == "W4" {
				if o, ok := r.value(s, row{caseID: "W4", metric: "order_original"}); ok {
					if o == 1 {
						cellText += ", original order"
					} else {
						cellText += ", **reordered**"
					}
				}
			} else if baseOK && s != base {
				cellText += " (" + fmtRatio(throughputRatio(rw.kind, v, baseV)) + ")"
			}
			fmt.Fprintf(&b, " %s |", cellText)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")

	// Allocations and RSS.
	b.WriteString("### Allocations per message and peak RSS\n\n")
	b.WriteString("Allocations are heap allocations per message in the timed phase, net of the one 128-byte body the workload allocates per published message; peak RSS is the process's VmHWM in that run (each run is its own process).\n\n")
	r.header(&b, "Workload")
	type arow struct {
		label, caseID string
		metrics       []string
		rss           bool
	}
	var arows []arow
	for _, c := range r.cases {
		switch c.Workload {
		case "W1", "W2", "D1", "D2", "D3":
			arows = append(arows, arow{c.ID + " allocs/msg · peak RSS", c.ID, []string{"allocs_per_msg"}, true})
		case "W3":
			arows = append(arows, arow{"W3 allocs/msg publish / drain · peak RSS", c.ID, []string{"publish_allocs_per_msg", "drain_allocs_per_msg"}, true})
		case "W4":
			arows = append(arows, arow{"W4 allocs per requeued msg · peak RSS", c.ID, []string{"requeue_allocs_per_msg"}, true})
		case "S1":
			arows = append(arows, arow{c.ID + " allocs/msg publish / consume · peak RSS", c.ID, []string{"publish_allocs_per_msg", "consume_allocs_per_msg"}, true})
		case "S2":
			arows = append(arows, arow{c.ID + " allocs/msg · peak RSS", c.ID, []string{"allocs_per_msg"}, true})
		}
	}
	for _, ar := range arows {
		fmt.Fprintf(&b, "| %s |", ar.label)
		for _, s := range r.systems {
			c := r.cells[key{s, ar.caseID}]
			var parts []string
			for _, mt := range ar.metrics {
				if v, ok := c.median(mt); ok {
					parts = append(parts, fmtAllocs(v))
				}
			}
			if len(parts) == 0 {
				fmt.Fprintf(&b, " %s |", r.status(s, ar.caseID))
				continue
			}
			text := strings.Join(parts, " / ")
			if rss, ok := c.medianRSS(); ok {
				text += " · " + fmtMB(rss)
			}
			switch spec, _ := bench.Lookup(s); {
			case spec.ClientOnly:
				text += r.note(s + ": allocations and RSS are those of the client process only; the broker runs in its own process.")
			case spec.WithServer:
				text += r.note(s + ": allocations and RSS are those of the client and the server together: both run in the bench process.")
			}
			fmt.Fprintf(&b, " %s |", text)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	r.diskTable(&b)
	if v, ok := r.cells[key{"rabbitmq", "W3"}].median("server_rss_bytes"); ok {
		fmt.Fprintf(&b, "The RabbitMQ node's own RSS right after W3's publish phase (backlog at its peak): %s (median).\n\n", fmtMB(v))
	}
	if cb := r.channelBase(); cb != "" {
		if v, ok := r.cells[key{cb, "W3"}].medianRSS(); ok {
			fmt.Fprintf(&b, "W3 peak RSS relative to %s's (%s):", cb, fmtMB(v))
			for _, s := range r.systems {
				if w, ok := r.cells[key{s, "W3"}].medianRSS(); ok && s != cb {
					fmt.Fprintf(&b, " %s %.2f×;", s, w/v)
				}
			}
			b.WriteString("\n\n")
		}
	}

	// warren against each peer: in memory against the in-memory peers, durable against the
	// durable ones.
	for _, me := range r.systems {
		if !strings.HasPrefix(me, "warren") {
			continue
		}
		var peers []string
		for _, s := range r.systems {
			if !strings.HasPrefix(s, "warren") && durable(s) == durable(me) {
				peers = append(peers, s)
			}
		}
		var lines []string
		for _, rw := range r.rows() {
			mv, ok := r.value(me, rw)
			if !ok {
				continue
			}
			var line strings.Builder
			line.WriteString("| " + rw.label + " |")
			any := false
			for _, p := range peers {
				pv, ok := r.value(p, rw)
				if !ok {
					line.WriteString(" — |")
					continue
				}
				line.WriteString(" " + fmtRatio(throughputRatio(rw.kind, mv, pv)) + " |")
				any = true
			}
			if any {
				lines = append(lines, line.String())
			}
		}
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "### %s against each peer (%s's throughput ÷ the peer's; above 1: %s is faster)\n\n", me, me, me)
		b.WriteString("| Workload |")
		for _, p := range peers {
			fmt.Fprintf(&b, " ÷ %s |", p)
		}
		b.WriteString("\n|---|")
		for range peers {
			b.WriteString("---:|")
		}
		b.WriteString("\n" + strings.Join(lines, "\n") + "\n\n")
	}

	// Targets.
	b.WriteString("### Targets (issue)\n\n| System | Target | Measured | Result |\n|---|---|---|---|\n")
	for _, t := range r.targets() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.system, t.name, t.measured, t.result)
	}
	b.WriteString("\n")

	// Order and setup notes.
	b.WriteString("### Order\n\n")
	for _, s := range r.systems {
		spec, _ := bench.Lookup(s)
		var seen []string
		for _, c := range r.cases {
			cl := r.cells[key{s, c.ID}]
			if cl == nil {
				continue
			}
			var ooo int64
			for _, res := range cl.runs {
				if c.Workload != "W4" {
					ooo += res.OutOfOrder
				}
			}
			if ooo > 0 {
				seen = append(seen, fmt.Sprintf("%s: %d out of order over %d runs", c.ID, ooo, len(cl.runs)))
			}
		}
		switch {
		case !spec.Ordered && len(seen) > 0:
			fmt.Fprintf(&b, "- %s promises no order, so this is no failure; deliveries out of order were seen in %s.\n", s, strings.Join(seen, "; "))
		case !spec.Ordered:
			fmt.Fprintf(&b, "- %s promises no order; none was out of order in these runs.\n", s)
		case len(seen) > 0:
			fmt.Fprintf(&b, "- %s: order broken (a failure): %s.\n", s, strings.Join(seen, "; "))
		default:
			fmt.Fprintf(&b, "- %s: every consumer received each producer's messages in order in every ordered workload.\n", s)
		}
	}
	b.WriteString("\n### Setup of each system\n\n")
	for _, s := range r.systems {
		spec, _ := bench.Lookup(s)
		fmt.Fprintf(&b, "- **%s**: %s.\n", s, spec.Setup)
	}
	b.WriteString("\n")
	for i, n := range r.notes {
		fmt.Fprintf(&b, "[^%d]: %s\n", i+1, n)
	}
	return b.String()
}

// diskTable is the bytes the durable systems left in their directories at the end of each run
// (every message consumed and acknowledged by then), where any did.
func (r *report) diskTable(b *strings.Builder) {
	var systems []string
	for _, s := range r.systems {
		for _, c := range r.cases {
			if _, ok := r.cells[key{s, c.ID}].median("disk_bytes_end"); ok && durable(s) && !slices.Contains(systems, s) {
				systems = append(systems, s)
			}
		}
	}
	if len(systems) == 0 {
		return
	}
	b.WriteString("### Disk after each run\n\n")
	b.WriteString("What the system's data directory held at the end of the run, when every message had been consumed and acknowledged: bytes in files (median) · files. warren counts its log's segments (`*.wal`); JetStream every file under its store directory. warren removes a segment once nothing in it or before it is needed, but never the one it is writing (512 KiB, the default segment size).\n\n")
	fmt.Fprintf(b, "| Workload |")
	for _, s := range systems {
		fmt.Fprintf(b, " %s |", s)
	}
	b.WriteString("\n|---|")
	for range systems {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, c := range r.cases {
		fmt.Fprintf(b, "| %s |", c.ID)
		for _, s := range systems {
			cl := r.cells[key{s, c.ID}]
			v, ok := cl.median("disk_bytes_end")
			if !ok {
				fmt.Fprintf(b, " %s |", r.status(s, c.ID))
				continue
			}
			f, _ := cl.median("disk_files_end")
			fmt.Fprintf(b, " %s · %.0f |", fmtBytes(v), f)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

func fmtBytes(v float64) string {
	switch {
	case v >= 1<<20:
		return fmt.Sprintf("%.1f MiB", v/(1<<20))
	case v >= 1<<10:
		return fmt.Sprintf("%.0f KiB", v/(1<<10))
	}
	return fmt.Sprintf("%.0f B", v)
}

func (r *report) header(b *strings.Builder, first string) {
	fmt.Fprintf(b, "| %s |", first)
	for _, s := range r.systems {
		fmt.Fprintf(b, " %s |", s)
	}
	b.WriteString("\n|---|")
	for range r.systems {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
}

type target struct{ system, name, measured, result string }

func (r *report) targets() []target {
	var ts []target
	get := func(s, c, m string) (float64, bool) { return r.cells[key{s, c}].median(m) }
	ratio := func(me, name, c, m string, peer string, min float64) {
		a, ok1 := get(me, c, m)
		p, ok2 := get(peer, c, m)
		if !ok1 || !ok2 {
			ts = append(ts, target{me, name, "not measured", "—"})
			return
		}
		v := a / p
		ts = append(ts, target{me, name, fmt.Sprintf("%s (%s vs %s)", fmtTargetRatio(v), fmtRate(a), fmtRate(p)), verdictText(v >= min)})
	}
	// The in-memory targets are against chan-min, the cheapest handoff a Go developer would
	// write (a channel of the body), not chan's channel of *warren.Message: against that one,
	// warren was partly compared with its own message allocation.
	const base = "chan-min"
	for _, me := range []string{"warren", "warren-block"} {
		if !slices.Contains(r.systems, me) || (r.hasDurable() && r.channelBase() == "") {
			continue // the durable suite has warren in memory as its reference, not for these
		}
		// warren-block is bounded as chan-min is in W1/W2, so the same two ratios hold it to
		// the same limit.
		ratio(me, "W1 ≥ 0.5× chan-min", "W1", "rate", base, 0.5)
		if me == "warren" {
			ratio(me, "W1 ≥ 30× watermill-gochannel", "W1", "rate", "watermill-gochannel", 30)
			ratio(me, "W1 ≥ 50× nats-jetstream-mem", "W1", "rate", "nats-jetstream-mem", 50)
			ratio(me, "W1 ≥ 80× rabbitmq", "W1", "rate", "rabbitmq", 80)
		}
		ratio(me, "W2 ≥ 0.45× chan-min", "W2", "rate", base, 0.45)
		if me == "warren" {
			ratio(me, "W3 publish ≥ 0.6× chan-min", "W3", "publish_rate", base, 0.6)
			ratio(me, "W3 drain (consume + ack) ≥ 0.2× chan-min", "W3", "drain_rate", base, 0.2)
			ts = append(ts, r.s1Target(me, base, 0.3))
			ts = append(ts, r.memoryTarget(me, base, 64))
		}
		var parts []string
		okAll, any := true, false
		for _, cm := range [][2]string{{"W1", "allocs_per_msg"}, {"W2", "allocs_per_msg"}, {"W3", "publish_allocs_per_msg"}, {"W3", "drain_allocs_per_msg"}} {
			if v, ok := get(me, cm[0], cm[1]); ok {
				any = true
				name := cm[0]
				if cm[0] == "W3" {
					name += strings.TrimSuffix(strings.TrimSuffix(" "+cm[1], "_allocs_per_msg"), "_per_msg")
				}
				parts = append(parts, fmt.Sprintf("%s %.3f", name, v))
				if cm[1] != "drain_allocs_per_msg" && v > 1.05 {
					okAll = false
				}
			}
		}
		if any {
			ts = append(ts, target{me, "one allocation per message on the steady path (publish + consume + ack, ≤ 1.05)", strings.Join(parts, ", "), verdictText(okAll)})
		}
		if me == "warren" {
			if o, ok := get(me, "W4", "order_original"); ok {
				ts = append(ts, target{me, "W4 exact original order after requeue", map[bool]string{true: "original", false: "reordered"}[o == 1], verdictText(o == 1)})
			} else {
				ts = append(ts, target{me, "W4 exact original order after requeue", "not measured", "—"})
			}
			if v, ok := get(me, "W4", "requeue_ms_per_1k"); ok {
				ts = append(ts, target{me, "W4 ≤ 1 ms per 1k requeued", fmt.Sprintf("%.3f ms per 1k", v), verdictText(v <= 1)})
			} else {
				ts = append(ts, target{me, "W4 ≤ 1 ms per 1k requeued", "not measured", "—"})
			}
			lo, ok1 := get(me, "S1/1k", "total_ns")
			hi, ok2 := get(me, "S1/10M", "total_ns")
			if ok1 && ok2 {
				lp, _ := get(me, "S1/1k", "publish_ns")
				hp, _ := get(me, "S1/10M", "publish_ns")
				lc, _ := get(me, "S1/1k", "consume_ns")
				hc, _ := get(me, "S1/10M", "consume_ns")
				ts = append(ts, target{me, "S1 cost at 10M ≤ 2× cost at 1k (publish + consume + ack)",
					fmt.Sprintf("%.3f× (%s vs %s; publish %s vs %s, consume + ack %s vs %s)", hi/lo, fmtNs(hi), fmtNs(lo), fmtNs(hp), fmtNs(lp), fmtNs(hc), fmtNs(lc)), verdictText(hi/lo <= 2)})
			} else {
				ts = append(ts, target{me, "S1 cost at 10M ≤ 2× cost at 1k", "not measured", "—"})
			}
		}
	}
	// The durable suite's.
	minRate := func(me, name, c string, min float64) {
		v, ok := get(me, c, "rate")
		if !ok {
			ts = append(ts, target{me, name, "not measured", "—"})
			return
		}
		ts = append(ts, target{me, name, fmtRate(v), verdictText(v >= min)})
	}
	for _, me := range []string{"warren-durable-never", "warren-durable-interval"} {
		if !slices.Contains(r.systems, me) || !r.hasWorkload("W1") {
			continue
		}
		minRate(me, "W1 ≥ 300k msg/s", "W1", 300_000)
		ratio(me, "W1 ≥ 10× nats-jetstream-file", "W1", "rate", "nats-jetstream-file", 10)
		if r.hasWorkload("D3") {
			// The same two targets where both sides wait for each confirm (Publish, JetStream.Publish).
			minRate(me, "D3 (a Publish that waits for its confirm) ≥ 300k msg/s", "D3", 300_000)
			ratio(me, "D3 ≥ 10× nats-jetstream-file (both waiting for each confirm)", "D3", "rate", "nats-jetstream-file", 10)
		}
	}
	if slices.Contains(r.systems, "warren-durable-always") && r.hasWorkload("D1") {
		minRate("warren-durable-always", "D1 (SyncAlways, 64 publishers) ≥ 20k msg/s", "D1", 20_000)
	}
	// contrib/amqp's server against the RabbitMQ node, with the same client code (amqp091-go,
	// confirms) and workload: at least 5× its throughput.
	if slices.Contains(r.systems, "warren-amqp") && slices.Contains(r.systems, "rabbitmq") {
		for _, cm := range [][3]string{{"W1", "rate", "W1"}, {"W2", "rate", "W2"}, {"W3", "publish_rate", "W3 publish"}, {"W3", "drain_rate", "W3 drain"}} {
			if r.hasWorkload(cm[0]) {
				ratio("warren-amqp", cm[2]+" ≥ 5× rabbitmq", cm[0], cm[1], "rabbitmq", 5)
			}
		}
	}
	// contrib/rabbitmq's Client against plain amqp091-go with confirms, on the same node and
	// workload: within 20%.
	if slices.Contains(r.systems, "rabbitmq-client") && slices.Contains(r.systems, "rabbitmq") {
		for _, cm := range [][3]string{{"W1", "rate", "W1"}, {"W2", "rate", "W2"}, {"W3", "publish_rate", "W3 publish"}, {"W3", "drain_rate", "W3 drain"}} {
			if r.hasWorkload(cm[0]) {
				ratio("rabbitmq-client", cm[2]+" ≥ 0.8× rabbitmq", cm[0], cm[1], "rabbitmq", 0.8)
			}
		}
	}
	return ts
}

// s1Target is S1's consume + ack at every depth both systems ran, as throughput: base's ns
// per message over me's, at least min at each depth (the deepest is where a queue's structure
// shows, the shallowest where its fixed cost does, so neither alone is the target).
func (r *report) s1Target(me, base string, min float64) target {
	name := fmt.Sprintf("S1 consume + ack ≥ %g× %s at every depth (%s's ns per message ÷ %s's)", min, base, base, me)
	var parts []string
	ok := true
	for _, c := range r.cases {
		if c.Workload != "S1" {
			continue
		}
		a, ok1 := r.cells[key{me, c.ID}].median("consume_ns")
		p, ok2 := r.cells[key{base, c.ID}].median("consume_ns")
		if !ok1 || !ok2 {
			continue
		}
		v := p / a
		ok = ok && v >= min
		parts = append(parts, fmt.Sprintf("%s %s (%s vs %s)", strings.TrimPrefix(c.ID, "S1/"), fmtTargetRatio(v), fmtNs(a), fmtNs(p)))
	}
	if len(parts) == 0 {
		return target{me, name, "not measured", "—"}
	}
	return target{me, name, strings.Join(parts, ", "), verdictText(ok)}
}

// memoryTarget is W3's memory at the full backlog: the process's RSS right after the publish
// phase, beyond base's, per message, at most max bytes. The process's peak comes later, in the
// drain, where warren allocates deliveries and a channel nothing; it is shown beside it.
func (r *report) memoryTarget(me, base string, max float64) target {
	n := sizes(r.o.quick, 1).W3
	name := fmt.Sprintf("W3 RSS at the %s-message backlog ≤ %g B per message beyond %s's", fmtCount(n), max, base)
	a, ok1 := r.cells[key{me, "W3"}].median("rss_backlog_bytes")
	p, ok2 := r.cells[key{base, "W3"}].median("rss_backlog_bytes")
	if !ok1 || !ok2 {
		return target{me, name, "not measured", "—"}
	}
	per := (a - p) / float64(n)
	m := fmt.Sprintf("%.0f B per message (%s vs %s: %s)", per, fmtMB(a), fmtMB(p), fmtTargetRatio(a/p))
	if pa, ok := r.cells[key{me, "W3"}].medianRSS(); ok {
		if pp, ok := r.cells[key{base, "W3"}].medianRSS(); ok {
			m += fmt.Sprintf("; process peak, in the drain: %s vs %s (%.0f B per message)", fmtMB(pa), fmtMB(pp), (pa-pp)/float64(n))
		}
	}
	return target{me, name, m, verdictText(per <= max)}
}

// fmtCount is a message count as the issue writes it: 1M, 100k, 20000.
func fmtCount(n int) string {
	switch {
	case n >= 1e6 && n%1e6 == 0:
		return fmt.Sprintf("%dM", n/1e6)
	case n >= 1e3 && n%1e3 == 0:
		return fmt.Sprintf("%dk", n/1e3)
	}
	return strconv.Itoa(n)
}

func verdictText(ok bool) string {
	if ok {
		return "PASS"
	}
	return "**MISS**"
}

func (r *report) jsonValue() any {
	type out struct {
		Machine  machine                                  `json:"machine"`
		Command  string                                   `json:"command"`
		Elapsed  float64                                  `json:"elapsed_seconds,omitempty"`
		Quick    bool                                     `json:"quick,omitempty"`
		Runs     int                                      `json:"runs"`
		Sizes    bench.Sizes                              `json:"sizes"`
		Scaled   map[string]float64                       `json:"scaled,omitempty"`
		Medians  map[string]map[string]map[string]float64 `json:"medians"`
		NA       map[string]map[string]string             `json:"not_applicable"`
		Skipped  map[string]map[string]string             `json:"skipped"`
		Results  []bench.Result                           `json:"results"`
		Footnote []string                                 `json:"footnotes"`
	}
	o := out{Machine: r.machine, Command: r.command, Elapsed: r.elapsed.Seconds(), Quick: r.o.quick, Runs: r.o.runs,
		Sizes: sizes(r.o.quick, 1), Scaled: r.scaled,
		Medians: map[string]map[string]map[string]float64{}, NA: map[string]map[string]string{}, Skipped: map[string]map[string]string{}, Footnote: r.notes}
	for _, c := range r.cases {
		for _, s := range r.systems {
			cl := r.cells[key{s, c.ID}]
			if cl == nil {
				continue
			}
			put := func(m map[string]map[string]string, v string) {
				if m[c.ID] == nil {
					m[c.ID] = map[string]string{}
				}
				m[c.ID][s] = v
			}
			if cl.na != "" {
				put(o.NA, cl.na)
			}
			if cl.skip != "" {
				put(o.Skipped, cl.skip)
			}
			o.Results = append(o.Results, cl.runs...)
			if len(cl.ok()) == 0 || len(cl.failures()) > 0 {
				continue
			}
			med := map[string]float64{}
			for _, mt := range bench.SortedMetricNames(cl.ok()[0].Metrics) {
				if v, ok := cl.median(mt); ok {
					med[mt] = v
				}
			}
			if v, ok := cl.medianRSS(); ok {
				med["peak_rss_bytes"] = v
			}
			if o.Medians[c.ID] == nil {
				o.Medians[c.ID] = map[string]map[string]float64{}
			}
			o.Medians[c.ID][s] = med
		}
	}
	return o
}

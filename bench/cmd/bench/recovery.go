package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenmq/warren/bench"
)

// -recovery: warren's recovery time and its log's disk use (bench/recovery.go). Every step runs
// in a child process of its own:
//
//   - clean: a child fills a durable queue with the backlog and closes the broker; another
//     child opens the directory and times it.
//   - crash: a child fills the backlog and, once every message is confirmed, prints its result
//     and waits; the driver kills it with SIGKILL (no Close: the log is as a crash leaves it;
//     the page cache, which a process kill does not touch, keeps what was written); another
//     child opens it.
//   - cold (with -cold-open): as clean, but the page cache is dropped before the open, as after
//     a reboot.
//   - steady: a child holds a queue at each of -steady-depths while messages flow through it,
//     sampling the log's size.

// The variants of the open measurement.
var openVariants = []struct{ name, title string }{
	{"clean", "after a clean Close"},
	{"crash", "after SIGKILL of the publishing process"},
	{"cold", "after a clean Close, page cache dropped"},
}

func recoveryChild(o options) int {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	stop, err := startProfiles(o) // the whole step's
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer stop()
	var r bench.Result
	switch o.step {
	case "fill":
		res, b := bench.RunFill(o.dir, o.recoveryN, o.sync)
		r = res
		r.Case = o.caseID
		if o.crash && b != nil {
			printResult(r)
			select {} // the driver kills this process
		}
		if b != nil {
			t0 := time.Now()
			b.Close()
			r.Metrics["close_ms"] = float64(time.Since(t0).Microseconds()) / 1000
			if bytes, files, err := bench.WALUsage(o.dir); err == nil {
				r.Metrics["closed_disk_bytes"], r.Metrics["closed_disk_files"] = float64(bytes), float64(files)
			}
		}
	case "open":
		r = bench.RunOpen(ctx, o.caseID, o.dir, o.recoveryN, o.sync)
	case "steady":
		r = bench.RunSteady(ctx, o.dir, o.depth, o.steadyN)
	default:
		fmt.Fprintf(os.Stderr, "unknown -step %q\n", o.step)
		return 2
	}
	r.Case = o.caseID
	printResult(r)
	return 0
}

func printResult(r bench.Result) {
	b, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	fmt.Println(string(b))
}

// recoveryStep runs one child step in dir and returns its result. With kill, the child is sent
// SIGKILL as soon as it has printed its result.
func recoveryStep(o options, step, caseID, dir string, extra []string, kill bool) bench.Result {
	args := []string{"-child", "-recovery", "-step", step, "-case", caseID, "-step-dir", dir,
		"-recovery-n", strconv.Itoa(o.recoveryN), "-steady-n", strconv.Itoa(o.steadyN),
		"-sync", o.sync, "-timeout", o.timeout.String()}
	args = append(args, extra...)
	if kill {
		args = append(args, "-crash")
	}
	return childStep(o, args, "warren-durable", caseID, kill)
}

// childStep runs this binary with args, a child that prints its result as a JSON line (of
// system's case caseID), and returns that result. With kill, the child is sent SIGKILL as soon
// as it has printed it.
func childStep(o options, args []string, system, caseID string, kill bool) bench.Result {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		return bench.Result{System: system, Case: caseID, Error: err.Error()}
	}
	var r bench.Result
	got := false
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var next bench.Result
		if json.Unmarshal(sc.Bytes(), &next) == nil && next.Case != "" {
			r, got = next, true
			if kill {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					r.Notes = append(r.Notes, "kill: "+err.Error())
				}
				break
			}
		}
	}
	_, _ = io.Copy(io.Discard, out)
	werr := cmd.Wait()
	if kill && got {
		var ee *exec.ExitError
		if errors.As(werr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				r.Notes = append(r.Notes, "killed by SIGKILL after its last confirm")
				return r
			}
		}
		r.OK, r.Error = false, fmt.Sprintf("the child was to be killed by SIGKILL, but exited: %v", werr)
		return r
	}
	if !got {
		msg := "child failed"
		if werr != nil {
			msg += ": " + werr.Error()
		}
		if tail := lastLines(stderr.String(), 3); tail != "" {
			msg += ": " + tail
		}
		return bench.Result{System: system, Case: caseID, Error: msg}
	}
	return r
}

// dropCaches writes back dirty pages and drops the page cache (root only), so that the next
// open reads the log from the disk.
func dropCaches() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}

type recoveryReport struct {
	Machine  machine        `json:"machine"`
	Command  string         `json:"command"`
	Elapsed  float64        `json:"elapsed_seconds"`
	Runs     int            `json:"runs"`
	Messages int            `json:"messages"`
	SteadyN  int            `json:"steady_messages"`
	Depths   []int          `json:"steady_depths"`
	Results  []bench.Result `json:"results"`
	// Medians: case → metric → median over the runs that passed.
	Medians map[string]map[string]float64 `json:"medians"`
}

func recoveryParent(o options) error {
	if o.quick {
		unlessSet("runs", &o.runs, 1)
		unlessSet("recovery-n", &o.recoveryN, 20_000)
		unlessSet("steady-n", &o.steadyN, 50_000)
		unlessSet("steady-depths", &o.steady, "1000,10000")
	}
	if o.runs < 1 {
		return errors.New("-runs must be at least 1")
	}
	var depths []int
	for f := range strings.SplitSeq(o.steady, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 1 {
			return fmt.Errorf("bad -steady-depths entry %q", f)
		}
		depths = append(depths, d)
	}
	variants := openVariants[:2]
	if o.coldOpen {
		if os.Geteuid() != 0 {
			return errors.New("-cold-open drops the page cache, which needs root")
		}
		variants = openVariants
	}
	rep := recoveryReport{Machine: describeMachine(), Command: strings.TrimSpace("go run ./cmd/bench " + strings.Join(os.Args[1:], " ")),
		Runs: o.runs, Messages: o.recoveryN, SteadyN: o.steadyN, Depths: depths}
	rep.Machine.TempFS = tempFS()
	start := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[%s] "+format+"\n", append([]any{time.Since(start).Round(time.Second)}, args...)...)
	}
	for run := 1; run <= o.runs; run++ {
		for _, v := range variants {
			dir, err := os.MkdirTemp(bench.DurableDir, "warren-bench-recovery-")
			if err != nil {
				return err
			}
			fill := recoveryStep(o, "fill", "recovery/fill-"+v.name, dir, nil, v.name == "crash")
			rep.Results = append(rep.Results, fill)
			logf("run %d/%d fill (%s): %s", run, o.runs, v.name, summary(fill))
			if fill.OK {
				if v.name == "cold" {
					if err := dropCaches(); err != nil {
						os.RemoveAll(dir)
						return fmt.Errorf("drop caches: %w", err)
					}
				}
				open := recoveryStep(o, "open", "recovery/open-"+v.name, dir, nil, false)
				rep.Results = append(rep.Results, open)
				logf("run %d/%d open (%s): %s", run, o.runs, v.name, recoverySummary(open))
			}
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
		}
		for _, d := range depths {
			dir, err := os.MkdirTemp(bench.DurableDir, "warren-bench-steady-")
			if err != nil {
				return err
			}
			r := recoveryStep(o, "steady", fmt.Sprintf("recovery/steady/%d", d), dir, []string{"-depth", strconv.Itoa(d)}, false)
			rep.Results = append(rep.Results, r)
			logf("run %d/%d steady at %d: %s", run, o.runs, d, recoverySummary(r))
			if err := os.RemoveAll(dir); err != nil {
				return err
			}
		}
	}
	rep.Elapsed = time.Since(start).Seconds()
	rep.Machine.LoadEnd = loadAvg()
	return rep.write(o)
}

// recoveryRerender renders recovery.md again from a recovery.json (-recovery -from F).
func recoveryRerender(o options) error {
	var rep recoveryReport
	if err := readJSON(o.from, &rep); err != nil {
		return err
	}
	return rep.write(o)
}

// write computes the medians and writes recovery.md and recovery.json into o.out.
func (rep *recoveryReport) write(o options) error {
	rep.Medians = map[string]map[string]float64{}
	byCase := map[string][]bench.Result{}
	for _, r := range rep.Results {
		byCase[r.Case] = append(byCase[r.Case], r)
	}
	for c, rs := range byCase {
		if med := metricMedians(rs); med != nil {
			rep.Medians[c] = med
		}
	}
	return writeReport(o.out, "recovery", rep.markdown(byCase), rep)
}

// metricMedians is each metric's median over results rs, or nil when any of them failed.
func metricMedians(rs []bench.Result) map[string]float64 {
	if slices.ContainsFunc(rs, func(r bench.Result) bool { return !r.OK }) {
		return nil
	}
	med := map[string]float64{}
	for _, m := range bench.SortedMetricNames(rs[0].Metrics) {
		var vs []float64
		for _, r := range rs {
			if v, ok := r.Metrics[m]; ok {
				vs = append(vs, v)
			}
		}
		med[m] = median(vs)
	}
	return med
}

// readJSON decodes the JSON file at path into v.
func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// writeReport prints md and writes it to name.md in dir, and v as JSON to name.json.
func writeReport(dir, name, md string, v any) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fmt.Print(md)
	if err := os.WriteFile(filepath.Join(dir, name+".md"), []byte(md), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), js, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s/%s.md and %s.json\n", dir, name, name)
	return nil
}

func recoverySummary(r bench.Result) string {
	return summaryOf(r, "open_ms", "first_delivery_ms", "drain_rate", "release_ms", "released_disk_files", "steady_rate", "disk_max_over_live", "disk_mean_over_live", "disk_max_files")
}

func (rep *recoveryReport) markdown(byCase map[string][]bench.Result) string {
	var b strings.Builder
	m := rep.Machine
	b.WriteString("## Recovery and disk use of warren's log\n\n")
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s RAM, %s, %s, %s. Log directories in %s. Load average (1, 5, 15 min) at the start %s, at the end %s.\n\n", m.CPUs, m.CPU, m.RAM, m.Kernel, m.Go, m.Date, m.TempFS, m.LoadStart, m.LoadEnd)
	fmt.Fprintf(&b, "Command: `%s` (%d run(s) of each step, each step a fresh process; medians; %s in all).\n\n", rep.Command, rep.Runs, time.Duration(rep.Elapsed*float64(time.Second)).Round(time.Second))
	fmt.Fprintf(&b, "Backlog: %d persistent messages of %d bytes in one durable queue, published with `PublishBatch` of %d under `SyncNever` (a confirm means written to the OS). The open is timed from the call of `warren.Open` until `Broker.Queue` returns the queue and its `Len()` is the whole backlog; the open uses `SyncNever` too (it does not sync anything it reads).\n\n", rep.Messages, bench.BodySize, bench.RecoveryFillBatch)

	get := func(c, metric string) (float64, bool) {
		v, ok := rep.Medians[c][metric]
		return v, ok
	}
	cellOf := func(c, metric string, f func(float64) string) string {
		rs := byCase[c]
		if len(rs) == 0 {
			return "—"
		}
		for _, r := range rs {
			if !r.OK {
				return "FAIL: " + r.Error
			}
		}
		v, ok := get(c, metric)
		if !ok {
			return "—"
		}
		text := f(v)
		if len(rs) > 1 {
			var all []string
			for _, r := range rs {
				all = append(all, f(r.Metrics[metric]))
			}
			text += " (" + strings.Join(all, ", ") + ")"
		}
		return text
	}
	ms := func(v float64) string { return fmtMs(v) }
	var variants []string
	for _, v := range openVariants {
		if len(byCase["recovery/fill-"+v.name]) > 0 {
			variants = append(variants, v.name)
		}
	}
	title := map[string]string{}
	for _, v := range openVariants {
		title[v.name] = v.title
	}

	b.WriteString("### Open\n\nMedian, then each run's value in parentheses.\n\n| |")
	for _, v := range variants {
		fmt.Fprintf(&b, " %s |", title[v])
	}
	b.WriteString("\n|---|")
	for range variants {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	rows := []struct {
		label, step, metric string
		f                   func(float64) string
	}{
		{"open until the queue holds the backlog", "open", "open_ms", ms},
		{"open until the first delivery", "open", "first_delivery_ms", ms},
		{"RSS right after the open", "open", "open_rss_bytes", fmtMB},
		{"drain after the open (consume + ack), msg/s", "open", "drain_rate", fmtRate},
		{"repairs at open (Broker.Recovery: a torn or damaged end cut)", "open", "repaired_events", fmtInt},
		{"fill (PublishBatch of 256, SyncNever), msg/s", "fill", "fill_rate", fmtRate},
		{"Close after the fill", "fill", "close_ms", ms},
	}
	for _, rw := range rows {
		fmt.Fprintf(&b, "| %s |", rw.label)
		for _, v := range variants {
			c := "recovery/" + rw.step + "-" + v
			if _, ok := get(c, rw.metric); !ok && len(byCase[c]) > 0 && !slices.ContainsFunc(byCase[c], func(r bench.Result) bool { return !r.OK }) {
				b.WriteString(" — |") // not measured in this variant (a killed fill does not close)
				continue
			}
			fmt.Fprintf(&b, " %s |", cellOf(c, rw.metric, rw.f))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")

	b.WriteString("### Disk: the backlog, drained, closed\n\nThe log's segments (`*.wal`): bytes · files (medians). Body bytes are the messages' 128-byte bodies; the rest of a message's record is its envelope (exchange, routing key, properties), its placement in the queue and the batch framing.\n\n")
	b.WriteString("| When | Disk | Per message | ÷ body bytes |\n|---|---:|---:|---:|\n")
	c := "recovery/fill-clean"
	if bytes, ok := get(c, "backlog_disk_bytes"); ok {
		files, _ := get(c, "backlog_disk_files")
		fmt.Fprintf(&b, "| full backlog (%d messages) | %s · %.0f | %.1f B | %.2f× |\n", rep.Messages, fmtBytes(bytes), files, bytes/float64(rep.Messages), bytes/float64(rep.Messages*bench.BodySize))
	}
	if bytes, ok := get(c, "closed_disk_bytes"); ok {
		files, _ := get(c, "closed_disk_files")
		fmt.Fprintf(&b, "| after Close, full backlog | %s · %.0f | %.1f B | %.2f× |\n", fmtBytes(bytes), files, bytes/float64(rep.Messages), bytes/float64(rep.Messages*bench.BodySize))
	}
	oc := "recovery/open-clean"
	for _, w := range []struct{ prefix, label string }{
		{"drained", "reopened and drained (every message acked), at once"},
		{"released", "… once released segments are gone (waited for up to 5 s)"},
		{"closed", "… and after Close"},
	} {
		if bytes, ok := get(oc, w.prefix+"_disk_bytes"); ok {
			files, _ := get(oc, w.prefix+"_disk_files")
			fmt.Fprintf(&b, "| %s | %s · %.0f | — | — |\n", w.label, fmtBytes(bytes), files)
		}
	}
	if v, ok := get(oc, "release_ms"); ok {
		if files, _ := get(oc, "drained_disk_files"); files <= 1 {
			b.WriteString("\nThe backlog's segments were gone by the time the drain's last ack returned (the segment left holds the deliveries' and acks' records, written after the open).\n")
		} else {
			fmt.Fprintf(&b, "\nAfter the drain, the released segments went within %s (median).\n", fmtMs(v))
		}
	}
	b.WriteString("\n")

	if len(rep.Depths) > 0 {
		fmt.Fprintf(&b, "### Disk: a queue held at a steady depth\n\nA durable queue (`SyncInterval(100ms)`) filled to the depth, then %d messages through it: publish 1000 (one `PublishBatch`), consume and ack 1000, again; the queue holds between the depth and the depth + 1000. The log's size is sampled every 20 ms. Live bytes: the messages the queue holds (from publish to ack) × the bytes per message the log took for the fill. Medians over the runs.\n\n", rep.SteadyN)
		b.WriteString("| Depth | Live (records) | Live (bodies) | Disk max | Disk mean | Disk at the end | max ÷ live | mean ÷ live | Segments max | msg/s through |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, d := range rep.Depths {
			c := fmt.Sprintf("recovery/steady/%d", d)
			if _, ok := rep.Medians[c]; !ok {
				fmt.Fprintf(&b, "| %d | %s |\n", d, cellOf(c, "live_bytes", fmtBytes))
				continue
			}
			g := func(m string) float64 { v, _ := get(c, m); return v }
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %.2f× | %.2f× | %.0f | %s |\n", d, fmtBytes(g("live_bytes")), fmtBytes(g("live_body_bytes")),
				fmtBytes(g("disk_max_bytes")), fmtBytes(g("disk_mean_bytes")), fmtBytes(g("disk_end_bytes")),
				g("disk_max_over_live"), g("disk_mean_over_live"), g("disk_max_files"), fmtRate(g("steady_rate")))
		}
		b.WriteString("\n")
	}

	b.WriteString("### Targets (issue)\n\n| Target | Measured | Result |\n|---|---|---|\n")
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "**MISS**"
	}
	for _, t := range []struct {
		variant string
		limit   float64
	}{{"clean", 2000}, {"crash", 5000}, {"cold", 2000}} {
		v, ok := get("recovery/open-"+t.variant, "open_ms")
		if !ok {
			if t.variant != "cold" {
				fmt.Fprintf(&b, "| open %s ≤ %s | not measured | — |\n", title[t.variant], fmtMs(t.limit))
			}
			continue
		}
		name := fmt.Sprintf("open %s ≤ %.0f s (%d-message backlog)", title[t.variant], t.limit/1000, rep.Messages)
		if t.variant == "cold" {
			name += " (the clean target, for reference)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", name, fmtMs(v), verdict(v <= t.limit))
	}
	if bytes, ok := get(oc, "released_disk_files"); ok {
		fmt.Fprintf(&b, "| drained: the segments are gone (one left: the log's current segment) | %.0f file(s) | %s |\n", bytes, verdict(bytes <= 1))
	}
	for _, d := range rep.Depths {
		c := fmt.Sprintf("recovery/steady/%d", d)
		if v, ok := get(c, "disk_max_over_live"); ok {
			mean, _ := get(c, "disk_mean_over_live")
			fmt.Fprintf(&b, "| steady queue at depth %d: disk ≤ 2× live | max %.2f×, mean %.2f× | %s |\n", d, v, mean, verdict(v <= 2))
		}
	}
	b.WriteString("\n")
	return b.String()
}

// Command bench runs the comparative benchmarks: every system × workload, each run in a fresh
// process (this binary re-executed with -child), -runs times, and reports medians as a
// markdown table (stdout, results/results.md), raw and median numbers (results/results.json)
// and a chart (results/chart.png).
//
//	go run ./cmd/bench                       # everything, 3 runs each
//	go run ./cmd/bench -quick                # a smoke run: toy sizes, 1 run, no rabbitmq
//	go run ./cmd/bench -systems warren,chan -workloads W1,S1/1M -runs 5
//	go run ./cmd/bench -durable              # the durable suite: W1, D1, D2 on the durable systems
//	go run ./cmd/bench -recovery             # recovery and disk use of warren's log (recovery.go)
//	go run ./cmd/bench -backlog              # a deep backlog's memory, disk and bytes written (backlog.go)
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenmq/warren/bench"
)

type options struct {
	systems, workloads string
	runs               int
	quick              bool
	out                string
	timeout            time.Duration
	deep               string // systems that run S1/10M
	scale              string // system=factor reductions for slow peers
	noChart            bool
	readme             string // a README to put the headline table into
	from               string // re-render the report from a results.json
	durable            bool   // the durable suite: its systems, workloads, sizes and out dir
	recovery           bool   // the recovery and disk measurement (recovery.go)
	recoveryN          int
	steady             string // the depths of the steady-queue disk measurement
	steadyN            int
	coldOpen           bool // also time an open with the page cache dropped (root)
	backlog            bool // the backlog measurement (backlog.go)
	backlogN           int
	backlogW1          int

	// child mode
	child   bool
	system  string
	caseID  string
	factor  float64
	step    string // -recovery's child: fill, open, steady; -backlog's: fill-drain, w1-empty, w1-backlog
	dir     string // -recovery's child: the log's directory
	sync    string // -recovery's child: the log's sync policy (never, interval)
	crash   bool   // fill: be killed after the last confirm instead of closing
	depth   int    // steady
	cpuprof string // a CPU profile of the child's run, for looking into one measurement
	memprof string // an allocation profile of the child's run
	trace   string // an execution trace of the child's run (go tool trace -pprof=sched shows wake-up delays)
}

func main() {
	var o options
	flag.StringVar(&o.systems, "systems", "", "comma-separated systems (default: the suite's): "+strings.Join(bench.Systems(), ",")+"; with -backlog: "+backlogDefaultSystems())
	flag.StringVar(&o.workloads, "workloads", "", "comma-separated workloads (W1,W2,W3,W4,S1,S2,D1,D2) or cases (S1/1M, S2/10kq, D2/64, …); default: the suite's ("+bench.MemoryWorkloads+"; with -durable "+bench.DurableWorkloads+"); all: every one")
	flag.BoolVar(&o.durable, "durable", false, "the durable suite: systems "+strings.Join(bench.SuiteSystems(true), ",")+", workloads "+bench.DurableWorkloads+", -scale "+durableScale+", -out results/durable")
	flag.BoolVar(&o.recovery, "recovery", false, "measure warren's recovery (open after a clean close and after a kill -9) and its log's disk use, into -out (default results/durable): recovery.md, recovery.json")
	flag.IntVar(&o.recoveryN, "recovery-n", 1_000_000, "-recovery: the backlog's messages")
	flag.StringVar(&o.steady, "steady-depths", "10000,1000000", "-recovery: the depths at which a queue is held steady while messages flow through it, to watch the log's disk use")
	flag.IntVar(&o.steadyN, "steady-n", 2_000_000, "-recovery: messages through the steady queue at each depth")
	flag.BoolVar(&o.coldOpen, "cold-open", false, "-recovery: also time an open after dropping the page cache (sync; echo 3 > /proc/sys/vm/drop_caches: root)")
	flag.BoolVar(&o.backlog, "backlog", false, "measure what a backlog of -n messages in one durable queue costs each of -systems (heap, RSS, disk, bytes written; fill, drain, warren's open; W1 into the backlog), into -out (default results/backlog): backlog.md, backlog.json")
	flag.IntVar(&o.backlogN, "n", 10_000_000, "-backlog: the backlog's messages")
	flag.IntVar(&o.backlogW1, "backlog-w1", 1_000_000, "-backlog: the messages of W1 on an empty queue and into the full backlog")
	flag.StringVar(&bench.DurableDir, "dir", bench.DurableDir, "where the durable systems and -recovery make their temporary directories (default $TMPDIR, else /tmp); it must be a real disk, not a tmpfs")
	flag.IntVar(&o.runs, "runs", 3, "fresh-process runs per system and case; the report shows medians")
	flag.BoolVar(&o.quick, "quick", false, "smoke run: toy sizes, 1 run, no rabbitmq unless -systems names it")
	flag.StringVar(&o.out, "out", "results", "directory for results.md, results.json and chart.png")
	flag.DurationVar(&o.timeout, "timeout", 15*time.Minute, "limit for one child run")
	flag.StringVar(&o.deep, "s1-10m", "chan-min,chan,warren", "systems that run S1 at a 10M backlog (the others are skipped there, with a footnote)")
	flag.StringVar(&o.scale, "scale", memoryScale, "system=factor or system/workload=factor,…: run a slow peer's W1, W2, W3, S1 measurement, S2, D1 and D2 message counts (or one workload's) scaled by factor (footnoted)")
	flag.BoolVar(&o.noChart, "no-chart", false, "do not write chart.png")
	flag.StringVar(&o.readme, "readme", "", "also put the throughput table, the machine and the command into this file, between its "+readmeBegin+" and "+readmeEnd+" lines (the project's README: ../README.md)")
	flag.StringVar(&o.from, "from", "", "render the report again from results.json files (comma-separated; a later file's cells replace an earlier one's), measuring nothing, into -out")
	flag.IntVar(&bench.BlockMaxLength, "block-maxlen", bench.BlockMaxLength, "warren-block's MaxLength")
	flag.IntVar(&bench.RabbitConfirmWindow, "rabbit-window", bench.RabbitConfirmWindow, "the most unconfirmed publishes per producer of rabbitmq and rabbitmq-durable (their confirm window), and of rabbitmq-client (its goroutines, each in a Client.Publish, and its Client's MaxInFlight)")
	flag.BoolVar(&bench.S1CollectFirst, "s1-gc", bench.S1CollectFirst, "S1: collect the heap after filling the backlog, before the timed phase")
	flag.BoolVar(&o.child, "child", false, "internal: run one measurement and print its result as JSON")
	flag.StringVar(&o.system, "system", "", "internal (-child): the system")
	flag.StringVar(&o.caseID, "case", "", "internal (-child): the case")
	flag.StringVar(&o.step, "step", "", "internal (-child -recovery): fill, open or steady; (-child -backlog): fill-drain, w1-empty or w1-backlog")
	flag.StringVar(&o.dir, "step-dir", "", "internal (-child -recovery): the log's directory")
	flag.StringVar(&o.sync, "sync", bench.SyncNever, "internal (-child -recovery): the log's sync policy, never or interval")
	flag.BoolVar(&o.crash, "crash", false, "internal (-child -recovery -step fill): wait to be killed after the last confirm instead of closing")
	flag.IntVar(&o.depth, "depth", 0, "internal (-child -recovery -step steady): the depth")
	flag.Float64Var(&o.factor, "factor", 1, "internal (-child): size factor")
	flag.StringVar(&o.cpuprof, "cpuprofile", "", "with -child: write a CPU profile of the run to this file (go tool pprof)")
	flag.StringVar(&o.memprof, "memprofile", "", "with -child: write an allocation profile of the run to this file (go tool pprof -sample_index=alloc_objects)")
	flag.StringVar(&o.trace, "trace", "", "with -child: write an execution trace of the run to this file (go tool trace)")
	flag.Parse()

	if o.durable || o.recovery {
		if !flagSet("out") {
			o.out = filepath.Join("results", "durable")
		}
		if !flagSet("scale") && o.durable {
			o.scale = durableScale
		}
	}
	if o.backlog {
		if !flagSet("out") {
			o.out = filepath.Join("results", "backlog")
		}
		if !flagSet("timeout") {
			o.timeout = backlogTimeout
		}
	}
	if o.child && o.recovery {
		os.Exit(recoveryChild(o))
	}
	if o.child && o.backlog {
		os.Exit(backlogChild(o))
	}
	if o.child {
		os.Exit(child(o))
	}
	run := parent
	switch {
	case o.from != "" && o.recovery:
		run = recoveryRerender
	case o.from != "" && o.backlog:
		run = backlogRerender
	case o.backlog:
		run = backlogParent
	case o.from != "":
		run = rerender
	case o.recovery:
		run = recoveryParent
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// The default -scale of each suite: the slow peers' sizes. In the durable suite a single
// publisher that waits for an fsync per message (warren-durable-always, nats-jetstream-file-sync
// and rabbitmq-durable in D3; JetStream with SyncAlways in W1 too) manages a few hundred to a few thousand messages a second here: 1M
// would take hours. JetStream with SyncAlways syncs every message even with 64 publishers (D1).
// warren-amqp runs at rabbitmq's sizes, the peer it is measured against (its amqp091-go client
// alone allows a few tens of thousands of messages a second here).
const (
	memoryScale  = "rabbitmq=0.1,rabbitmq-client=0.1,warren-amqp=0.1"
	durableScale = "warren-durable-always/D3=0.01,nats-jetstream-file=0.2,nats-jetstream-file-sync=0.01,nats-jetstream-file-sync/D1=0.02,rabbitmq-durable/D3=0.005,rabbitmq-durable/D1=0.1"
)

// sizes are the sizes of one child run.
func sizes(quick bool, factor float64) bench.Sizes {
	sz := bench.FullSizes()
	if quick {
		sz = bench.QuickSizes()
	}
	if factor != 1 {
		f := func(n int) int { return max(1000, int(float64(n)*factor)) }
		sz.W1, sz.W2, sz.W3, sz.S2Messages = f(sz.W1), f(sz.W2), f(sz.W3), f(sz.S2Messages)
		sz.S1Measure = max(sz.S1Batch*10, f(sz.S1Measure)/sz.S1Batch*sz.S1Batch)
		sz.D1, sz.D2, sz.D3 = f(sz.D1), f(sz.D2), f(sz.D3)
	}
	return sz
}

// factorFor is the size factor of system's run of workload: scale's "system/workload" entry,
// else its "system" entry, else 1.
func factorFor(scale map[string]float64, system, workload string) (float64, string) {
	if f, ok := scale[system+"/"+workload]; ok {
		return f, system + "/" + workload
	}
	if f, ok := scale[system]; ok {
		return f, system
	}
	return 1, ""
}

// startProfiles starts the CPU profile and the execution trace a child was asked for
// (-cpuprofile, -trace); stop ends them and closes their files.
func startProfiles(o options) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range slices.Backward(stops) {
			f()
		}
	}
	for _, p := range []struct {
		path  string
		start func(io.Writer) error
		stop  func()
	}{{o.cpuprof, pprof.StartCPUProfile, pprof.StopCPUProfile}, {o.trace, trace.Start, trace.Stop}} {
		if p.path == "" {
			continue
		}
		f, err := os.Create(p.path)
		if err == nil {
			err = p.start(f)
		}
		if err != nil {
			stop()
			return nil, err
		}
		stops = append(stops, func() { p.stop(); f.Close() })
	}
	return stop, nil
}

func child(o options) int {
	c, err := bench.LookupCase(o.caseID, o.quick)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	stop, err := startProfiles(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer stop()
	r := bench.Run(ctx, o.system, c, sizes(o.quick, o.factor))
	if o.memprof != "" {
		if err := writeAllocs(o.memprof); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(string(b))
	return 0
}

// writeAllocs writes the process's allocation profile to path.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runChild re-executes this binary for one measurement.
func runChild(o options, system string, c bench.Case, factor float64) bench.Result {
	args := []string{"-child", "-system", system, "-case", c.ID,
		"-factor", strconv.FormatFloat(factor, 'g', -1, 64),
		"-timeout", o.timeout.String(), "-block-maxlen", strconv.Itoa(bench.BlockMaxLength),
		"-rabbit-window", strconv.Itoa(bench.RabbitConfirmWindow),
		"-s1-gc=" + strconv.FormatBool(bench.S1CollectFirst)}
	if o.quick {
		args = append(args, "-quick")
	}
	if bench.DurableDir != "" {
		args = append(args, "-dir", bench.DurableDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var r bench.Result
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if jerr := json.Unmarshal([]byte(lines[len(lines)-1]), &r); jerr != nil {
		msg := "child failed"
		if err != nil {
			msg += ": " + err.Error()
		}
		if tail := lastLines(stderr.String(), 3); tail != "" {
			msg += ": " + tail
		}
		return bench.Result{System: system, Case: c.ID, Error: msg}
	}
	return r
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func parseScale(s string) (map[string]float64, error) {
	m := map[string]float64{}
	if s == "" {
		return m, nil
	}
	for kv := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || f <= 0 || f > 1 {
			return nil, fmt.Errorf("bad -scale entry %q: want system=factor with 0 < factor ≤ 1", kv)
		}
		m[strings.TrimSpace(k)] = f
	}
	return m, nil
}

func parent(o options) error {
	if o.quick && !flagSet("runs") {
		o.runs = 1
	}
	if o.runs < 1 {
		return errors.New("-runs must be at least 1")
	}
	var systems []string
	switch o.systems {
	case "", "all": // the suite's systems ("all": both suites'), without RabbitMQ in a quick run
		systems = bench.SuiteSystems(o.durable)
		if o.systems == "all" {
			systems = bench.Systems()
		}
		if o.quick {
			systems = slices.DeleteFunc(systems, bench.NeedsRabbit)
		}
	default:
		for s := range strings.SplitSeq(o.systems, ",") {
			s = strings.TrimSpace(s)
			if _, err := bench.Lookup(s); err != nil {
				return err
			}
			systems = append(systems, s)
		}
	}
	if o.workloads == "" {
		o.workloads = bench.MemoryWorkloads
		if o.durable {
			o.workloads = bench.DurableWorkloads
		}
	}
	cases, err := bench.CaseIDs(o.workloads, o.quick)
	if err != nil {
		return err
	}
	scale, err := parseScale(o.scale)
	if err != nil {
		return err
	}
	deep := map[string]bool{}
	for s := range strings.SplitSeq(o.deep, ",") {
		deep[strings.TrimSpace(s)] = true
	}

	rep := newReport(o, systems, cases)
	rep.command = strings.TrimSpace("go run ./cmd/bench " + strings.Join(os.Args[1:], " "))
	rep.machine = describeMachine()
	if rabbits := slices.DeleteFunc(slices.Clone(systems), func(s string) bool { return !bench.NeedsRabbit(s) }); len(rabbits) > 0 {
		if err := bench.ProbeRabbit(); err != nil {
			for _, s := range rabbits {
				line := fmt.Sprintf("%s: skipped — cannot connect to %s (%v); start one with ./rabbitmq.sh install && ./rabbitmq.sh start", s, bench.RabbitURL, err)
				fmt.Fprintln(os.Stderr, line)
				rep.skipSystem(s, line)
			}
		} else {
			rep.machine.RabbitMQ = rabbitVersion()
		}
	}
	if slices.ContainsFunc(systems, func(s string) bool { spec, _ := bench.Lookup(s); return spec.Durable }) {
		rep.machine.TempFS = tempFS()
	}
	for _, s := range systems {
		for _, c := range cases {
			if f, k := factorFor(scale, s, c.Workload); f != 1 && !o.quick {
				rep.scaled[k] = f
			}
		}
	}
	for _, c := range cases {
		for _, s := range systems {
			// A system that cannot do S1 at all says n/a there, not skipped.
			spec, _ := bench.Lookup(s)
			if _, na := spec.NA[c.Workload]; na {
				continue
			}
			if c.ID == "S1/10M" && !deep[s] && !o.quick {
				rep.skip(s, c.ID, "S1 at a 10M backlog is run for "+andList(sortedKeys(deep))+" only (-s1-10m): filling and draining 10M messages would take this peer many minutes per run")
			}
		}
	}

	start := time.Now()
	for run := 1; run <= o.runs; run++ {
		for _, c := range cases {
			for _, s := range systems {
				if rep.skipped(s, c.ID) {
					continue
				}
				spec, _ := bench.Lookup(s)
				if why, ok := spec.NA[c.Workload]; ok {
					rep.na(s, c.ID, why)
					continue
				}
				factor := 1.0
				if !o.quick {
					factor, _ = factorFor(scale, s, c.Workload)
				}
				t0 := time.Now()
				r := runChild(o, s, c, factor)
				rep.add(r)
				fmt.Fprintf(os.Stderr, "[run %d/%d %s] %-8s %-20s %s (%.1fs)\n", run, o.runs, time.Since(start).Round(time.Second), c.ID, s, summary(r), time.Since(t0).Seconds())
				if r.Skipped != "" {
					rep.skipSystem(s, r.Skipped)
				}
			}
		}
	}
	rep.elapsed = time.Since(start)
	rep.machine.LoadEnd = loadAvg()
	return rep.write(o)
}

// write prints the report and writes results.md, results.json and chart.png.
func (rep *report) write(o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	md := rep.markdown()
	fmt.Print(md)
	if err := os.WriteFile(filepath.Join(o.out, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep.jsonValue(), "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), js, 0o644); err != nil {
		return err
	}
	if !o.noChart {
		if err := rep.chart(filepath.Join(o.out, "chart.png")); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s/results.md, results.json and chart.png in %s\n", o.out, rep.elapsed.Round(time.Second))
	if o.readme != "" {
		if err := putReadme(o.readme, md); err != nil {
			return fmt.Errorf("readme: %w", err)
		}
		fmt.Fprintf(os.Stderr, "updated the table in %s\n", o.readme)
	}
	return nil
}

// The lines of a README between which -readme puts the headline table.
const (
	readmeBegin = "<!-- bench:begin -->"
	readmeEnd   = "<!-- bench:end -->"
)

// putReadme replaces what lies between the markers in the README at path with the report's
// machine and command lines and its throughput table, footnote marks dropped (the README
// points to results.md for those).
func putReadme(path, md string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	text := string(b)
	i, j := strings.Index(text, readmeBegin), strings.Index(text, readmeEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s lines", path, readmeBegin, readmeEnd)
	}
	var keep []string
	table := false
	for line := range strings.SplitSeq(md, "\n") {
		switch {
		case strings.HasPrefix(line, "Machine:"), strings.HasPrefix(line, "Command:"):
			keep = append(keep, line, "")
		case strings.HasPrefix(line, "### Throughput and cost"):
			table = true
		case table && strings.HasPrefix(line, "|"):
			keep = append(keep, footnoteMark.ReplaceAllString(line, ""))
		case table && len(keep) > 0 && strings.HasPrefix(keep[len(keep)-1], "|"):
			table = false // the table ended
		}
	}
	block := readmeBegin + "\n" + strings.Join(keep, "\n") + "\n"
	return os.WriteFile(path, []byte(text[:i]+block+text[j:]), 0o644)
}

var footnoteMark = regexp.MustCompile(`\[\^\d+\]`)

// unlessSet sets *p to v unless the flag name was given.
func unlessSet[T any](name string, p *T, v T) {
	if !flagSet(name) {
		*p = v
	}
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

func summary(r bench.Result) string {
	s := summaryOf(r, "rate", "publish_rate", "drain_rate", "requeue_ms", "publish_ns", "consume_ns", "route_ns", "allocs_per_msg", "disk_bytes_end")
	if r.OK {
		s += fmt.Sprintf(" rss=%dMB", r.PeakRSS>>20)
	}
	return s
}

// summaryOf is a line for the progress log: r's metrics named by keys, where it has them, or
// why it failed or was skipped.
func summaryOf(r bench.Result, keys ...string) string {
	switch {
	case r.Skipped != "":
		return "skipped: " + r.Skipped
	case !r.OK:
		return "FAIL: " + r.Error
	}
	parts := []string{"ok"}
	for _, k := range keys {
		if v, ok := r.Metrics[k]; ok {
			parts = append(parts, k+"="+strconv.FormatFloat(v, 'g', 4, 64))
		}
	}
	return strings.Join(parts, " ")
}

// andList is "a", "a and b", "a, b and c".
func andList(xs []string) string {
	if len(xs) < 2 {
		return strings.Join(xs, "")
	}
	return strings.Join(xs[:len(xs)-1], ", ") + " and " + xs[len(xs)-1]
}

func sortedKeys(m map[string]bool) []string {
	var ks []string
	for k, v := range m {
		if v {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// rerender rebuilds the report from a results.json written by an earlier run.
func rerender(o options) error {
	type input struct {
		Machine machine                      `json:"machine"`
		Command string                       `json:"command"`
		Elapsed float64                      `json:"elapsed_seconds"`
		Quick   bool                         `json:"quick"`
		Runs    int                          `json:"runs"`
		Scaled  map[string]float64           `json:"scaled"`
		NA      map[string]map[string]string `json:"not_applicable"`
		Skipped map[string]map[string]string `json:"skipped"`
		Results []bench.Result               `json:"results"`
	}
	// Later files replace earlier files' cells: a cell re-run on its own merges into the
	// full run.
	var in input
	for i, path := range strings.Split(o.from, ",") {
		var next input
		if err := readJSON(path, &next); err != nil {
			return err
		}
		if i == 0 {
			in = next
			continue
		}
		replaced := map[[2]string]bool{}
		for _, r := range next.Results {
			replaced[[2]string{r.System, r.Case}] = true
		}
		in.Results = slices.DeleteFunc(in.Results, func(r bench.Result) bool { return replaced[[2]string{r.System, r.Case}] })
		in.Results = append(in.Results, next.Results...)
		in.Elapsed += next.Elapsed
		in.Command += "; " + next.Command
	}
	o.runs, o.quick = in.Runs, in.Quick
	present := map[string]bool{}
	sysPresent := map[string]bool{}
	for _, r := range in.Results {
		present[r.Case], sysPresent[r.System] = true, true
	}
	for _, m := range []map[string]map[string]string{in.NA, in.Skipped} {
		for c, bySys := range m {
			present[c] = true
			for s := range bySys {
				sysPresent[s] = true
			}
		}
	}
	var cases []bench.Case
	for _, c := range bench.Cases(in.Quick) {
		if present[c.ID] {
			cases = append(cases, c)
		}
	}
	var systems []string
	for _, s := range bench.Systems() {
		if sysPresent[s] {
			systems = append(systems, s)
		}
	}
	rep := newReport(o, systems, cases)
	rep.machine, rep.command = in.Machine, in.Command
	rep.elapsed = time.Duration(in.Elapsed * float64(time.Second))
	if in.Scaled != nil {
		rep.scaled = in.Scaled
	}
	for c, bySys := range in.NA {
		for s, why := range bySys {
			rep.na(s, c, why)
		}
	}
	for c, bySys := range in.Skipped {
		for s, why := range bySys {
			rep.skip(s, c, why)
		}
	}
	for _, r := range in.Results {
		rep.add(r)
	}
	return rep.write(o)
}

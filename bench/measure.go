package bench

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// NewBody returns a fresh BodySize-byte body carrying seq in its first 8 bytes. Every system
// gets a fresh body per message, as an application producing distinct messages would make:
// that is one allocation per published message made by the workload, not by the system, and
// the allocation counts subtract it.
func NewBody(seq uint64) []byte {
	b := make([]byte, BodySize)
	binary.BigEndian.PutUint64(b, seq)
	return b
}

// SeqOf reads the sequence number from a body (all ones for a body too short to carry one).
func SeqOf(body []byte) uint64 {
	if len(body) < 8 {
		return ^uint64(0)
	}
	return binary.BigEndian.Uint64(body)
}

// phase measures the wall time and the heap allocations (runtime.MemStats.Mallocs) of one
// phase of a workload. Allocations are counted process-wide: the system's own goroutines
// (an embedded server's included) count, a broker in another process does not.
type phase struct {
	t0 time.Time
	m0 uint64
}

func begin() phase {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return phase{t0: time.Now(), m0: ms.Mallocs}
}

func (p phase) end() (time.Duration, uint64) {
	d := time.Since(p.t0)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return d, ms.Mallocs - p.m0
}

// procStatusBytes reads a "Key:   123 kB" line of a /proc/*/status file, in bytes.
func procStatusBytes(path, key string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, key) {
			continue
		}
		fields := strings.Fields(strings.TrimPrefix(line, key))
		if len(fields) == 0 {
			return 0, false
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, false
		}
		return n * 1024, true
	}
	return 0, false
}

// PeakRSS is this process's peak resident set size so far (VmHWM).
func PeakRSS() int64 {
	n, _ := procStatusBytes("/proc/self/status", "VmHWM:")
	return n
}

// CurrentRSS is this process's resident set size now (VmRSS).
func CurrentRSS() int64 {
	n, _ := procStatusBytes("/proc/self/status", "VmRSS:")
	return n
}

// checker records which sequence numbers arrived: duplicates at once, losses at the end.
type checker struct {
	n    uint64
	bits []atomic.Uint64
	dups atomic.Int64
	bad  atomic.Int64 // out of range: not a message of this run
}

func newChecker(n int) *checker {
	return &checker{n: uint64(n), bits: make([]atomic.Uint64, (n+63)/64)}
}

// mark records seq and reports whether it had arrived before.
func (c *checker) mark(seq uint64) bool {
	if seq >= c.n {
		c.bad.Add(1)
		return false
	}
	w := &c.bits[seq>>6]
	m := uint64(1) << (seq & 63)
	if w.Or(m)&m != 0 {
		c.dups.Add(1)
		return true
	}
	return false
}

func (c *checker) missing() int64 {
	var seen uint64
	for i := range c.bits {
		seen += uint64(bits.OnesCount64(c.bits[i].Load()))
	}
	return int64(c.n - seen)
}

// order checks that each producer's messages arrive in increasing order at one consumer.
// Producer p of P publishes the sequence numbers p, p+P, p+2P, …
type order struct {
	last       []int64
	violations int64
}

func newOrder(producers int) *order {
	o := &order{last: make([]int64, producers)}
	for i := range o.last {
		o.last[i] = -1
	}
	return o
}

func (o *order) see(seq uint64) {
	p := seq % uint64(len(o.last))
	if int64(seq) <= o.last[p] {
		o.violations++
		return
	}
	o.last[p] = int64(seq)
}

// watchdog cancels ctx with a stall error when progress has not moved for stall.
func watchdog(ctx context.Context, cancel context.CancelCauseFunc, progress *atomic.Int64, stall time.Duration, what func() error) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last, since := progress.Load(), time.Now()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-t.C:
				if p := progress.Load(); p != last {
					last, since = p, now
				} else if now.Sub(since) > stall {
					cancel(what())
					return
				}
			}
		}
	}()
	return func() { close(done) }
}

// ioCounters are a process's bytes written, from /proc/<pid>/io. wchar counts every write(2)
// and the like of the process, to files, pipes and sockets alike, whether or not the bytes
// reach a disk; writeBytes counts what the process caused to be sent to the storage layer
// (page-cache pages it dirtied, whole pages), and cancelled the part of that which was
// truncated or deleted before it was written back.
type ioCounters struct{ wchar, writeBytes, cancelled int64 }

func (c ioCounters) minus(o ioCounters) ioCounters {
	return ioCounters{c.wchar - o.wchar, c.writeBytes - o.writeBytes, c.cancelled - o.cancelled}
}

// readIO reads an io file of /proc (/proc/self/io; another user's process's needs root).
func readIO(path string) (ioCounters, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ioCounters{}, err
	}
	var c ioCounters
	fields := map[string]*int64{"wchar": &c.wchar, "write_bytes": &c.writeBytes, "cancelled_write_bytes": &c.cancelled}
	found := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if p, known := fields[k]; ok && known {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return ioCounters{}, fmt.Errorf("%s: %q: %w", path, line, err)
			}
			*p = n
			found++
		}
	}
	if found != len(fields) {
		return ioCounters{}, fmt.Errorf("%s: no wchar, write_bytes or cancelled_write_bytes", path)
	}
	return c, nil
}

package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

var errInjected = errors.New("injected I/O error")

// absent stands for a file a crash left no trace of.
const absent = "<absent>"

// fsOps runs operations on an FS for a test, failing it at the first unexpected error.
type fsOps struct {
	t  *testing.T
	fs FS
}

func (o fsOps) create(name string) File {
	o.t.Helper()
	f, err := o.fs.Create(name)
	if err != nil {
		o.t.Fatal(err)
	}
	return f
}

func (o fsOps) write(f File, s string) {
	o.t.Helper()
	if n, err := f.Write([]byte(s)); n != len(s) || err != nil {
		o.t.Fatalf("Write(%q) = %d, %v", s, n, err)
	}
}

func (o fsOps) do(err error) {
	o.t.Helper()
	if err != nil {
		o.t.Fatal(err)
	}
}

// crashOutcome returns what the named file of m reads after m crashes under mode with rng, or
// absent.
func crashOutcome(m *MemFS, name string, mode CrashMode, rng *rand.Rand) string {
	m.Crash(mode, rng)
	if c := m.Contents(name); c != nil {
		return string(c)
	}
	return absent
}

// TestMemFSCrash checks what a crash leaves of file "f" after each setup: every outcome the mode
// allows, and no other, occurs over many seeds.
func TestMemFSCrash(t *testing.T) {
	// syncedThenMore leaves "abc" synced and "def" written after it, all durable in the directory.
	syncedThenMore := func(o fsOps) File {
		f := o.create("f")
		o.write(f, "abc")
		o.do(f.Sync())
		o.do(o.fs.SyncDir())
		o.write(f, "def")
		return f
	}
	for _, tc := range []struct {
		name  string
		setup func(o fsOps, m *MemFS)
		mode  CrashMode
		may   []string // the possible outcomes
	}{
		{"KeepSynced drops the unsynced bytes", func(o fsOps, _ *MemFS) { syncedThenMore(o) },
			KeepSynced, []string{"abc"}},
		{"KeepPrefix keeps any prefix of the unsynced bytes", func(o fsOps, _ *MemFS) { syncedThenMore(o) },
			KeepPrefix, []string{"abc", "abcd", "abcde", "abcdef"}},
		{"KeepWritten keeps everything", func(o fsOps, _ *MemFS) { syncedThenMore(o) },
			KeepWritten, []string{"abcdef"}},
		{"a synced file is synced", func(o fsOps, _ *MemFS) { o.do(syncedThenMore(o).Sync()) },
			KeepPrefix, []string{"abcdef"}},
		{"closing is not syncing", func(o fsOps, _ *MemFS) { o.do(syncedThenMore(o).Close()) },
			KeepSynced, []string{"abc"}},
		{"a file never synced may be empty", func(o fsOps, _ *MemFS) {
			o.write(o.create("f"), "ab")
			o.do(o.fs.SyncDir())
		}, KeepPrefix, []string{"", "a", "ab"}},

		{"a Truncate into synced bytes is undone without Sync", func(o fsOps, _ *MemFS) {
			f := syncedThenMore(o)
			o.do(f.Sync())
			o.do(f.Truncate(2))
			o.write(f, "XY")
		}, KeepSynced, []string{"abcdef"}},
		{"a Truncate into synced bytes may or may not survive", func(o fsOps, _ *MemFS) {
			f := syncedThenMore(o)
			o.do(f.Sync())
			o.do(f.Truncate(2))
			o.write(f, "XY")
		}, KeepPrefix, []string{"abcdef", "ab", "abX", "abXY"}},
		{"two Truncates: the lower one counts", func(o fsOps, _ *MemFS) {
			f := syncedThenMore(o)
			o.do(f.Sync())
			o.do(f.Truncate(4))
			o.do(f.Truncate(1))
			o.write(f, "Z")
		}, KeepPrefix, []string{"abcdef", "a", "aZ"}},
		{"a synced Truncate is durable", func(o fsOps, _ *MemFS) {
			f := syncedThenMore(o)
			o.do(f.Sync())
			o.do(f.Truncate(2))
			o.do(f.Sync())
		}, KeepPrefix, []string{"ab"}},
		{"a Truncate of unsynced bytes only", func(o fsOps, _ *MemFS) {
			o.do(syncedThenMore(o).Truncate(4))
		}, KeepPrefix, []string{"abc", "abcd"}},
		{"a Truncate that extends adds unsynced zeros", func(o fsOps, _ *MemFS) {
			f := o.create("f")
			o.write(f, "a")
			o.do(f.Sync())
			o.do(o.fs.SyncDir())
			o.do(f.Truncate(3))
		}, KeepPrefix, []string{"a", "a\x00", "a\x00\x00"}},

		{"a file created without SyncDir vanishes", func(o fsOps, _ *MemFS) {
			f := o.create("f")
			o.write(f, "abc")
			o.do(f.Sync())
		}, KeepPrefix, []string{absent}},
		{"a process crash keeps a file created without SyncDir", func(o fsOps, _ *MemFS) {
			o.write(o.create("f"), "abc")
		}, KeepWritten, []string{"abc"}},
		{"a file removed without SyncDir comes back", func(o fsOps, _ *MemFS) {
			syncedThenMore(o)
			o.do(o.fs.Remove("f"))
		}, KeepPrefix, []string{"abc", "abcd", "abcde", "abcdef"}},
		{"a file removed with SyncDir is gone", func(o fsOps, _ *MemFS) {
			syncedThenMore(o)
			o.do(o.fs.Remove("f"))
			o.do(o.fs.SyncDir())
		}, KeepPrefix, []string{absent}},
		{"a file removed and created again without SyncDir: the old one comes back", func(o fsOps, _ *MemFS) {
			syncedThenMore(o)
			o.do(o.fs.Remove("f"))
			g := o.create("f")
			o.write(g, "new")
			o.do(g.Sync())
		}, KeepSynced, []string{"abc"}},
		{"a file removed while open keeps what is written through it", func(o fsOps, _ *MemFS) {
			f := syncedThenMore(o)
			o.do(o.fs.Remove("f"))
			o.write(f, "g")
			o.do(f.Sync())
		}, KeepSynced, []string{"abcdefg"}},

		{"a failed Sync makes nothing durable", func(o fsOps, m *MemFS) {
			f := syncedThenMore(o)
			m.FailSync(0, errInjected, KeepUnsynced)
			if err := f.Sync(); !errors.Is(err, errInjected) {
				o.t.Fatalf("Sync = %v, want %v", err, errInjected)
			}
		}, KeepSynced, []string{"abc"}},
		{"a failed Sync may leave the unsynced bytes", func(o fsOps, m *MemFS) {
			f := syncedThenMore(o)
			m.FailSync(0, errInjected, KeepUnsynced)
			_ = f.Sync()
		}, KeepPrefix, []string{"abc", "abcd", "abcde", "abcdef"}},
		{"a failed Sync may drop the unsynced bytes", func(o fsOps, m *MemFS) {
			f := syncedThenMore(o)
			m.FailSync(0, errInjected, DropUnsynced)
			_ = f.Sync()
			o.do(f.Sync())
		}, KeepPrefix, []string{"abc"}},
		{"a failed SyncDir makes nothing durable", func(o fsOps, m *MemFS) {
			f := o.create("f")
			o.write(f, "abc")
			o.do(f.Sync())
			m.FailSyncDir(0, errInjected)
			if err := o.fs.SyncDir(); !errors.Is(err, errInjected) {
				o.t.Fatalf("SyncDir = %v, want %v", err, errInjected)
			}
		}, KeepPrefix, []string{absent}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := make(map[string]bool)
			for seed := range uint64(300) {
				m := NewMemFS()
				tc.setup(fsOps{t, m}, m)
				got := crashOutcome(m, "f", tc.mode, rand.New(rand.NewPCG(seed, 0)))
				if !slices.Contains(tc.may, got) {
					t.Fatalf("seed %d: %v left %q, want one of %q", seed, tc.mode, got, tc.may)
				}
				seen[got] = true
				if got != absent && tc.mode != KeepWritten && !bytes.Equal(m.Synced("f"), []byte(got)) {
					t.Fatalf("seed %d: after a crash Synced = %q, want all of %q", seed, m.Synced("f"), got)
				}
			}
			if len(seen) != len(tc.may) {
				t.Errorf("%v left %q over the seeds, want each of %q", tc.mode, slices.Sorted(maps.Keys(seen)), tc.may)
			}
		})
	}
}

// TestMemFSTornTail checks that a torn tail keeps the synced bytes and a prefix of the unsynced
// ones, garbled in one run, with zeros or garbage, and sometimes not at all.
func TestMemFSTornTail(t *testing.T) {
	const synced = "abc"
	unsynced := bytes.Repeat([]byte{'x'}, 64)
	var zeroed, garbled, intact bool
	for seed := range uint64(500) {
		m := NewMemFS()
		o := fsOps{t, m}
		f := o.create("f")
		o.write(f, synced)
		o.do(f.Sync())
		o.do(m.SyncDir())
		o.write(f, string(unsynced))
		got := []byte(crashOutcome(m, "f", TornTail, rand.New(rand.NewPCG(seed, 1))))
		if !bytes.HasPrefix(got, []byte(synced)) || len(got) > len(synced)+len(unsynced) {
			t.Fatalf("seed %d: TornTail left %q", seed, got)
		}
		tail := got[len(synced):]
		first := bytes.IndexFunc(tail, func(r rune) bool { return r != 'x' })
		if first < 0 {
			intact = true
			continue
		}
		last := bytes.LastIndexFunc(tail, func(r rune) bool { return r != 'x' })
		run := tail[first : last+1]
		if bytes.Count(run, []byte{0}) == len(run) {
			zeroed = true
		} else {
			garbled = true
		}
	}
	if !zeroed || !garbled || !intact {
		t.Errorf("over the seeds: zeroed %v, garbled %v, intact %v; want each", zeroed, garbled, intact)
	}
}

// TestMemFSAfterCrash checks that every method of a File open at a crash fails with ErrCrashed,
// and that the MemFS works on what survived.
func TestMemFSAfterCrash(t *testing.T) {
	m := NewMemFS()
	o := fsOps{t, m}
	f := o.create("a")
	o.write(f, "abc")
	o.do(f.Sync())
	o.do(m.SyncDir())
	closed := o.create("b")
	o.do(closed.Close())
	m.Crash(KeepSynced, nil)

	for name, err := range map[string]error{
		"ReadAt":   func() error { _, err := f.ReadAt(make([]byte, 1), 0); return err }(),
		"Write":    func() error { _, err := f.Write([]byte("x")); return err }(),
		"Sync":     f.Sync(),
		"Truncate": f.Truncate(0),
		"Size":     func() error { _, err := f.Size(); return err }(),
		"Close":    f.Close(),
	} {
		var pe *fs.PathError
		if !errors.Is(err, ErrCrashed) || !errors.As(err, &pe) || pe.Path != "a" {
			t.Errorf("%s after a crash = %v, want a PathError on a wrapping ErrCrashed", name, err)
		}
	}
	if err := closed.Close(); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("Close of a file closed before the crash = %v, want fs.ErrClosed", err)
	}

	if names, err := m.List(); err != nil || !slices.Equal(names, []string{"a"}) {
		t.Fatalf("List = %q, %v; want [a]", names, err)
	}
	g, err := m.Open("a")
	o.do(err)
	o.write(g, "d")
	buf := make([]byte, 4)
	if n, err := g.ReadAt(buf, 0); n != 4 || err != nil || string(buf) != "abcd" {
		t.Fatalf("ReadAt = %d, %v, %q; want 4, nil, abcd", n, err, buf)
	}
	o.do(m.Remove("a"))
	o.create("a")
}

func TestMemFSFailWrite(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after int
		short bool
	}{
		{"first write, nothing written", 0, false},
		{"third write, nothing written", 2, false},
		{"first write, short", 0, true},
		{"third write, short", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(50) {
				m := NewMemFS()
				f := fsOps{t, m}.create("f")
				var rng *rand.Rand
				if tc.short {
					rng = rand.New(rand.NewPCG(seed, 2))
				}
				m.FailWrite(tc.after, errInjected, rng)
				var want []byte
				for i := range tc.after + 3 {
					p := bytes.Repeat([]byte{byte('a' + i)}, 100)
					n, err := f.Write(p)
					want = append(want, p[:n]...)
					switch {
					case i != tc.after:
						if n != len(p) || err != nil {
							t.Fatalf("write %d = %d, %v; want %d, nil", i, n, err, len(p))
						}
					case !errors.Is(err, errInjected):
						t.Fatalf("write %d = %d, %v; want an error wrapping %v", i, n, err, errInjected)
					case n >= len(p) || !tc.short && n != 0:
						t.Fatalf("failing write %d wrote %d of %d bytes (short %v)", i, n, len(p), tc.short)
					}
				}
				if got := m.Contents("f"); !bytes.Equal(got, want) {
					t.Fatalf("contents %q, want %q", got, want)
				}
			}
		})
	}
	m := NewMemFS()
	f := fsOps{t, m}.create("f")
	m.FailWrite(0, errInjected, nil)
	m.FailWrite(-1, nil, nil)
	fsOps{t, m}.write(f, "cancelled")
}

func TestMemFSFailSync(t *testing.T) {
	for _, tc := range []struct {
		failure SyncFailure
		after   int
		// contents is what the file reads after the failed Sync.
		contents string
	}{
		{KeepUnsynced, 0, "abcdef"},
		{KeepUnsynced, 1, "abcdef"},
		{DropUnsynced, 0, "abc"},
		{DropUnsynced, 1, "abc"},
	} {
		t.Run(fmt.Sprintf("%v after %d", tc.failure, tc.after), func(t *testing.T) {
			m := NewMemFS()
			o := fsOps{t, m}
			f := o.create("f")
			o.write(f, "abc")
			o.do(f.Sync())
			m.FailSync(tc.after, errInjected, tc.failure)
			for range tc.after {
				o.do(f.Sync())
			}
			o.write(f, "def")
			if err := f.Sync(); !errors.Is(err, errInjected) {
				t.Fatalf("Sync = %v, want an error wrapping %v", err, errInjected)
			}
			if got := string(m.Synced("f")); got != "abc" {
				t.Fatalf("after a failed Sync, Synced = %q, want abc", got)
			}
			if got := string(m.Contents("f")); got != tc.contents {
				t.Fatalf("after a failed Sync, Contents = %q, want %q", got, tc.contents)
			}
			o.do(f.Sync())
			if got := string(m.Synced("f")); got != tc.contents {
				t.Fatalf("after the next Sync, Synced = %q, want %q", got, tc.contents)
			}
		})
	}
}

// TestMemFSFailRead: the read FailRead arms fails, reading nothing; the one before and the one
// after it read.
func TestMemFSFailRead(t *testing.T) {
	m := NewMemFS()
	o := fsOps{t, m}
	f := o.create("f")
	o.write(f, "abcdef")
	m.FailRead(1, errInjected)
	p := make([]byte, 3)
	if n, err := f.ReadAt(p, 0); err != nil || string(p[:n]) != "abc" {
		t.Fatalf("the read before: ReadAt = %q, %v, want abc", p[:n], err)
	}
	if n, err := f.ReadAt(p, 3); n != 0 || !errors.Is(err, errInjected) {
		t.Fatalf("the failing read: ReadAt = %d, %v, want 0 and an error wrapping %v", n, err, errInjected)
	}
	if n, err := f.ReadAt(p, 3); err != nil || string(p[:n]) != "def" {
		t.Fatalf("the read after: ReadAt = %q, %v, want def", p[:n], err)
	}
}

func TestMemFSCapacity(t *testing.T) {
	m := NewMemFS()
	o := fsOps{t, m}
	m.Capacity(10)
	a, b := o.create("a"), o.create("b")
	o.write(a, "123456")
	n, err := b.Write([]byte("abcdef"))
	if n != 4 || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Write past capacity = %d, %v; want 4 and an error wrapping ErrNoSpace", n, err)
	}
	if n, err := b.Write([]byte("x")); n != 0 || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Write on a full disk = %d, %v; want 0 and ErrNoSpace", n, err)
	}
	if got := string(m.Contents("b")); got != "abcd" {
		t.Fatalf("contents %q, want abcd", got)
	}
	if got := m.Used(); got != 10 {
		t.Fatalf("Used() = %d, want 10", got)
	}
	o.do(a.Truncate(5))
	o.write(b, "e")
	o.do(m.Remove("a"))
	o.write(b, "fghij")
	m.Capacity(-1)
	o.write(b, "no limit")
}

// TestFSAgree runs one script on OSFS in a temporary directory and on MemFS, and checks that both
// give the results an os file system gives.
func TestFSAgree(t *testing.T) {
	want := []string{
		"create a: <nil>",
		"create a again: exist",
		"open b: not exist",
		"remove b: not exist",
		`write "hello world": 11 <nil>`,
		`read 5 at 0: "hello" <nil>`,
		`read 10 at 6: "world" EOF`,
		`read 1 at 11: "" EOF`,
		`read 0 at 20: "" <nil>`,
		"size: 11 <nil>",
		"truncate 5: <nil>",
		`read 11 at 0: "hello" EOF`,
		"truncate 8: <nil>",
		`write "!": 1 <nil>`,
		`read 9 at 0: "hello\x00\x00\x00!" <nil>`,
		"truncate -1: invalid",
		"sync: <nil>",
		"open a: <nil>",
		`write "?": 1 <nil>`,
		`read 10 at 0: "hello\x00\x00\x00!?" <nil>`,
		"create b: <nil>",
		"list: [a b] <nil>",
		"sync dir: <nil>",
		"remove a: <nil>",
		"list: [b] <nil>",
		"open a: not exist",
		`write "+": 1 <nil>`,
		"size: 11 <nil>",
		"close: <nil>",
		`write "x": 0 closed`,
		`read 1 at 0: "" closed`,
		"sync: closed",
		"truncate 0: closed",
		"size: 0 closed",
		"close: closed",
	}
	for _, tc := range []struct {
		name string
		fs   FS
	}{
		{"OSFS", OSFS{Dir: t.TempDir()}},
		{"MemFS", NewMemFS()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := agreementScript(tc.fs)
			for i := range max(len(got), len(want)) {
				var g, w string
				if i < len(got) {
					g = got[i]
				}
				if i < len(want) {
					w = want[i]
				}
				if g != w {
					t.Errorf("step %d: %s, want %s", i, g, w)
				}
			}
		})
	}
}

// agreementScript runs TestFSAgree's script on fsys and returns a line per step.
func agreementScript(fsys FS) []string {
	var out []string
	log := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	var f File
	create := func(name, label string) {
		g, err := fsys.Create(name)
		if err == nil {
			f = g
		}
		log("%s: %s", label, errKind(err))
	}
	write := func(s string) {
		n, err := f.Write([]byte(s))
		log("write %q: %d %s", s, n, errKind(err))
	}
	read := func(n int, off int64) {
		p := make([]byte, n)
		k, err := f.ReadAt(p, off)
		log("read %d at %d: %q %s", n, off, p[:k], errKind(err))
	}
	truncate := func(size int64) { log("truncate %d: %s", size, errKind(f.Truncate(size))) }
	size := func() {
		s, err := f.Size()
		log("size: %d %s", s, errKind(err))
	}
	list := func() {
		names, err := fsys.List()
		log("list: %v %s", names, errKind(err))
	}
	open := func(name string) {
		g, err := fsys.Open(name)
		if err == nil {
			f = g
		}
		log("open %s: %s", name, errKind(err))
	}

	create("a", "create a")
	first := f
	create("a", "create a again")
	open("b")
	log("remove b: %s", errKind(fsys.Remove("b")))
	write("hello world")
	read(5, 0)
	read(10, 6)
	read(1, 11)
	read(0, 20)
	size()
	truncate(5)
	read(11, 0)
	truncate(8)
	write("!")
	read(9, 0)
	truncate(-1)
	log("sync: %s", errKind(f.Sync()))
	open("a")
	write("?")
	read(10, 0)
	create("b", "create b")
	list()
	log("sync dir: %s", errKind(fsys.SyncDir()))
	log("remove a: %s", errKind(fsys.Remove("a")))
	list()
	open("a")
	f = first
	write("+")
	size()
	log("close: %s", errKind(f.Close()))
	write("x")
	read(1, 0)
	log("sync: %s", errKind(f.Sync()))
	truncate(0)
	size()
	log("close: %s", errKind(f.Close()))
	return out
}

// errKind names the io/fs or io sentinel err is or wraps, as errors.Is sees it.
func errKind(err error) string {
	switch {
	case err == nil:
		return "<nil>"
	case err == io.EOF:
		return "EOF"
	case errors.Is(err, fs.ErrExist):
		return "exist"
	case errors.Is(err, fs.ErrNotExist):
		return "not exist"
	case errors.Is(err, fs.ErrInvalid), errors.Is(err, syscall.EINVAL):
		// MemFS returns fs.ErrInvalid where os returns EINVAL, which is not fs.ErrInvalid.
		return "invalid"
	case errors.Is(err, fs.ErrClosed):
		return "closed"
	}
	return "other: " + err.Error()
}

// TestMemFSInvalid checks that names of other than flat files and negative offsets are refused
// with fs.ErrInvalid.
func TestMemFSInvalid(t *testing.T) {
	m := NewMemFS()
	for _, name := range []string{"", ".", "..", "a/b", "/a", "a/"} {
		_, cerr := m.Create(name)
		_, oerr := m.Open(name)
		rerr := m.Remove(name)
		for _, err := range []error{cerr, oerr, rerr} {
			if !errors.Is(err, fs.ErrInvalid) {
				t.Errorf("name %q: %v, want an error wrapping fs.ErrInvalid", name, err)
			}
		}
	}
	f := fsOps{t, m}.create("f")
	if _, err := f.ReadAt(make([]byte, 1), -1); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("ReadAt at -1: %v, want an error wrapping fs.ErrInvalid", err)
	}
}

// modelFile is TestMemFSRandom's model of a file, kept apart from MemFS's own representation:
// what it reads, its durable image, and how far they agree at the front.
type modelFile struct {
	data, image []byte
	same        int // data[:same] == image[:same]: the file's lowest size since the last Sync
}

// modelFS is TestMemFSRandom's model of a MemFS.
type modelFS struct {
	dir, durable map[string]*modelFile
	// The operations left to succeed before an injected fault, or -1.
	writeLeft, syncLeft, syncDirLeft int
	syncFailure                      SyncFailure
}

// count counts an operation against a pending fault and says whether it fails.
func count(left *int) bool {
	if *left < 0 {
		return false
	}
	*left--
	return *left < 0
}

type modelHandle struct {
	f  File
	mf *modelFile
}

// TestMemFSRandom runs random operations, faults and crashes on a MemFS and on a model of the
// rules, and checks after every step that the files read as the model says, and after every
// crash that each file holds what the crash mode allows: its synced bytes first, exactly them
// under KeepSynced.
func TestMemFSRandom(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 3))
		m := NewMemFS()
		mdl := &modelFS{dir: map[string]*modelFile{}, durable: map[string]*modelFile{}, writeLeft: -1, syncLeft: -1, syncDirLeft: -1}
		var open []modelHandle
		var crashed []File // files open at a crash
		fail := func(step int, format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d step %d: %s", seed, step, fmt.Sprintf(format, args...))
		}
		for step := range 1500 {
			name := names[rng.IntN(len(names))]
			var h *modelHandle
			if len(open) > 0 {
				h = &open[rng.IntN(len(open))]
			}
			switch r := rng.IntN(100); {
			case r < 8:
				f, err := m.Create(name)
				if _, exists := mdl.dir[name]; exists != errors.Is(err, fs.ErrExist) || !exists && err != nil {
					fail(step, "Create(%s) = %v, exists %v", name, err, exists)
				}
				if err == nil {
					mf := &modelFile{}
					mdl.dir[name] = mf
					open = append(open, modelHandle{f, mf})
				}
			case r < 14:
				f, err := m.Open(name)
				mf, exists := mdl.dir[name]
				if exists == errors.Is(err, fs.ErrNotExist) || exists && err != nil {
					fail(step, "Open(%s) = %v, exists %v", name, err, exists)
				}
				if err == nil {
					open = append(open, modelHandle{f, mf})
				}
			case r < 40 && h != nil:
				p := make([]byte, rng.IntN(20))
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				n, err := h.f.Write(p)
				if count(&mdl.writeLeft) {
					if !errors.Is(err, errInjected) || n > 0 && n >= len(p) {
						fail(step, "failing Write of %d = %d, %v", len(p), n, err)
					}
				} else if n != len(p) || err != nil {
					fail(step, "Write of %d = %d, %v", len(p), n, err)
				}
				h.mf.data = append(h.mf.data, p[:n]...)
			case r < 52 && h != nil:
				err := h.f.Sync()
				switch {
				case count(&mdl.syncLeft):
					if !errors.Is(err, errInjected) {
						fail(step, "failing Sync = %v", err)
					}
					if mdl.syncFailure == DropUnsynced {
						h.mf.data = h.mf.data[:h.mf.same]
					}
				case err != nil:
					fail(step, "Sync = %v", err)
				default:
					h.mf.image, h.mf.same = slices.Clone(h.mf.data), len(h.mf.data)
				}
			case r < 60 && h != nil:
				size := rng.IntN(len(h.mf.data) + 4)
				if err := h.f.Truncate(int64(size)); err != nil {
					fail(step, "Truncate(%d) = %v", size, err)
				}
				h.mf.same = min(h.mf.same, size)
				h.mf.data = append(h.mf.data[:min(size, len(h.mf.data))], make([]byte, max(size-len(h.mf.data), 0))...)
			case r < 64 && h != nil:
				if err := h.f.Close(); err != nil {
					fail(step, "Close = %v", err)
				}
				open = slices.DeleteFunc(open, func(o modelHandle) bool { return o.f == h.f })
			case r < 70:
				err := m.Remove(name)
				if _, exists := mdl.dir[name]; exists == errors.Is(err, fs.ErrNotExist) || exists && err != nil {
					fail(step, "Remove(%s) = %v, exists %v", name, err, exists)
				}
				delete(mdl.dir, name)
			case r < 76:
				err := m.SyncDir()
				if failing := count(&mdl.syncDirLeft); failing != errors.Is(err, errInjected) || !failing && err != nil {
					fail(step, "SyncDir = %v, failing %v", err, failing)
				}
				if err == nil {
					mdl.durable = maps.Clone(mdl.dir)
				}
			case r < 80:
				after := rng.IntN(4)
				switch rng.IntN(3) {
				case 0:
					var short *rand.Rand
					if rng.IntN(2) == 0 {
						short = rng
					}
					m.FailWrite(after, errInjected, short)
					mdl.writeLeft = after
				case 1:
					mdl.syncFailure = SyncFailure(rng.IntN(2))
					m.FailSync(after, errInjected, mdl.syncFailure)
					mdl.syncLeft = after
				default:
					m.FailSyncDir(after, errInjected)
					mdl.syncDirLeft = after
				}
			case r < 86 && h != nil:
				off := rng.IntN(len(h.mf.data) + 3)
				p := make([]byte, rng.IntN(10))
				n, err := h.f.ReadAt(p, int64(off))
				want := h.mf.data[min(off, len(h.mf.data)):]
				want = want[:min(len(want), len(p))]
				if wantErr := len(want) < len(p); !bytes.Equal(p[:n], want) || wantErr != (err == io.EOF) || !wantErr && err != nil {
					fail(step, "ReadAt(%d bytes, %d) = %d, %v, %x; want %x", len(p), off, n, err, p[:n], want)
				}
			case r < 90:
				// A crash of a copy checks Clone, and leaves m and its files as they are.
				checkCrash(t, m.Clone(), mdl, CrashMode(rng.IntN(4)), rng, "clone")
			case r >= 90:
				mode := CrashMode(rng.IntN(4))
				survivors := checkCrash(t, m, mdl, mode, rng, fmt.Sprintf("seed %d step %d", seed, step))
				if mode != KeepWritten {
					mdl.dir, mdl.durable = survivors, maps.Clone(survivors)
				}
				for _, h := range open {
					crashed = append(crashed, h.f)
				}
				open = nil
			}
			if got, want := must(m.List()), slices.Sorted(maps.Keys(mdl.dir)); !slices.Equal(got, want) {
				fail(step, "List = %q, want %q", got, want)
			}
			for name, mf := range mdl.dir {
				if got := m.Contents(name); !bytes.Equal(got, mf.data) {
					fail(step, "%s: Contents = %x, want %x", name, got, mf.data)
				}
				if got := m.Synced(name); !bytes.Equal(got, mf.image) {
					fail(step, "%s: Synced = %x, want %x", name, got, mf.image)
				}
			}
		}
		for _, f := range crashed {
			if _, err := f.Write([]byte("x")); !errors.Is(err, ErrCrashed) {
				t.Fatalf("seed %d: Write to a file open at a crash = %v, want ErrCrashed", seed, err)
			}
		}
	}
}

// checkCrash crashes m under mode and checks each file against the model: a power loss leaves the
// durable names, each starting with its synced bytes (those before the lowest Truncate since its
// last Sync, if a Truncate cut into them) and with what mode allows after them. It returns the
// model's files after a power loss.
func checkCrash(t *testing.T, m *MemFS, mdl *modelFS, mode CrashMode, rng *rand.Rand, where string) map[string]*modelFile {
	t.Helper()
	m.Crash(mode, rng)
	dir := mdl.durable
	if mode == KeepWritten {
		dir = mdl.dir
	}
	if got, want := must(m.List()), slices.Sorted(maps.Keys(dir)); !slices.Equal(got, want) {
		t.Fatalf("%s: after a crash (%v), List = %q, want %q", where, mode, got, want)
	}
	survivors := make(map[string]*modelFile)
	for name, mf := range dir {
		got := m.Contents(name)
		survivors[name] = &modelFile{data: got, image: slices.Clone(got), same: len(got)}
		isImage := bytes.Equal(got, mf.image)
		prefix := len(got) >= mf.same && len(got) <= len(mf.data)
		for i := mf.same; prefix && i < len(got) && mode == KeepPrefix; i++ {
			prefix = got[i] == mf.data[i]
		}
		ok := false
		switch {
		case !bytes.HasPrefix(got, mf.image[:mf.same]):
		case mf.same == len(mf.image) && !bytes.HasPrefix(got, mf.image):
		case mode == KeepSynced:
			ok = isImage
		case mode == KeepPrefix, mode == TornTail:
			ok = isImage || prefix
		case mode == KeepWritten:
			ok = bytes.Equal(got, mf.data) && bytes.Equal(m.Synced(name), mf.image)
		}
		if !ok {
			t.Fatalf("%s: %v left %s = %x; it read %x, synced %x, of which %d unchanged since", where, mode, name, got, mf.data, mf.image, mf.same)
		}
	}
	return survivors
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestMemFSConcurrent runs writers on their own files while the MemFS crashes, for the race
// detector: a writer whose file crashed opens it again.
func TestMemFSConcurrent(t *testing.T) {
	m := NewMemFS()
	var wg sync.WaitGroup
	var crashes atomic.Int64 // seen by the writers
	done := make(chan struct{})
	for i := range 4 {
		name := fmt.Sprint(i)
		wg.Go(func() {
			var f File
			for j := 0; ; j++ {
				select {
				case <-done:
					return
				default:
				}
				var err error
				if f == nil {
					if f, err = m.Open(name); errors.Is(err, fs.ErrNotExist) {
						f, err = m.Create(name)
					}
					if err == nil {
						err = m.SyncDir()
					}
				}
				if err == nil {
					_, err = f.Write([]byte{byte(j)})
				}
				if err == nil && j%3 == 0 {
					err = f.Sync()
				}
				if err == nil {
					var size int64
					if size, err = f.Size(); err == nil && size > 0 {
						_, err = f.ReadAt(make([]byte, 1), size-1)
					}
				}
				if err != nil {
					if !errors.Is(err, ErrCrashed) {
						t.Error(err)
						return
					}
					crashes.Add(1)
					f = nil
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(4, 4))
	for crashes.Load() < 100 && !t.Failed() {
		m.Crash(CrashMode(rng.IntN(4)), rng)
		_ = m.Clone()
		_, _ = m.List()
		runtime.Gosched()
	}
	close(done)
	wg.Wait()
}

package wal

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
)

// Errors of MemFS. Every error MemFS returns for a named file is an *fs.PathError, as os returns,
// wrapping one of these, an io/fs sentinel (fs.ErrNotExist, fs.ErrExist, fs.ErrClosed,
// fs.ErrInvalid) or an injected error; errors.Is finds each.
var (
	// ErrCrashed is returned by every method of a File that was open when its MemFS crashed.
	ErrCrashed = errors.New("wal: file system crashed")
	// ErrNoSpace is returned by a Write that would take the files of a MemFS past its capacity:
	// ENOSPC, a full disk.
	ErrNoSpace = errors.New("wal: no space left on device")
)

// CrashMode says what a crash leaves of the bytes written to a file but not synced. In every mode
// a crash keeps the synced bytes as they are.
type CrashMode int

const (
	// KeepSynced keeps exactly the synced bytes: a power loss before the disk wrote back anything
	// else.
	KeepSynced CrashMode = iota
	// KeepPrefix keeps the synced bytes and a prefix of the unsynced ones: none, some or all, as
	// far as the disk had written back. The length is random: none a quarter of the time, all a
	// quarter, and otherwise any, uniformly.
	KeepPrefix
	// TornTail is KeepPrefix, and then a random run of the kept unsynced bytes is overwritten with
	// zeros or with random bytes: a torn write, some of whose sectors reached the disk and some
	// not, or whose blocks were allocated and never written.
	TornTail
	// KeepWritten is a process crash (kill -9), not a power loss: the open files are lost, and
	// everything else stays, written bytes and directory changes, synced or not.
	KeepWritten
)

func (c CrashMode) String() string {
	switch c {
	case KeepSynced:
		return "KeepSynced"
	case KeepPrefix:
		return "KeepPrefix"
	case TornTail:
		return "TornTail"
	case KeepWritten:
		return "KeepWritten"
	}
	return fmt.Sprintf("CrashMode(%d)", int(c))
}

// SyncFailure says what a Sync that fails by injection (MemFS.FailSync) does to the bytes it
// failed to make durable.
type SyncFailure int

const (
	// KeepUnsynced leaves them in the file, still unsynced: a later Sync may make them durable.
	KeepUnsynced SyncFailure = iota
	// DropUnsynced drops them, as Linux can after an fsync error (the page cache marks the pages
	// clean and later forgets them): the file reads as its durable bytes, and the Sync that
	// follows succeeds without them ("fsyncgate").
	DropUnsynced
)

func (s SyncFailure) String() string {
	switch s {
	case KeepUnsynced:
		return "KeepUnsynced"
	case DropUnsynced:
		return "DropUnsynced"
	}
	return fmt.Sprintf("SyncFailure(%d)", int(s))
}

// MemFS is an FS in memory, for testing what a power loss leaves. Per file it keeps the bytes
// written and which of them are durable, and of the directory which entries are durable:
//
//   - File.Sync makes everything written to the file so far durable.
//   - SyncDir makes durable the existence of the files created, and the absence of the files
//     removed, since the last SyncDir. As POSIX says (ext4 and XFS do more), syncing a new file
//     does not make its name durable: a file created whose directory was never synced vanishes in
//     a crash, synced bytes and all; a file removed whose removal was not synced comes back.
//   - Truncate is durable only after a Sync. A crash before it may undo a Truncate that cut into
//     synced bytes, bringing them back; a Truncate of unsynced bytes only is a prefix like any.
//
// Crash is a power loss and a reboot: every open File fails with ErrCrashed from then on, the
// directory becomes its durable entries, and each file the bytes its CrashMode leaves; whatever
// survived is durable. MemFS is then usable again. A crash never changes a synced byte; the
// other files' fates are drawn independently, in the order of their names, so that a seeded
// generator makes a crash repeatable.
//
// FailWrite, FailSync, FailSyncDir, FailRead and Capacity inject errors: an I/O error on the
// n-th write, a failed fsync (with or without the loss of the unsynced bytes), a failed read, a
// full disk.
//
// What it does not model: a later write reaching the disk while an earlier one did not, other
// than as TornTail's garbled run; a synced byte going bad (bit rot, a misdirected write): a test
// of corruption edits a file itself; a failed SyncDir or Sync making part of its work durable;
// reads after a failed fsync returning the new bytes and later the old (DropUnsynced is the
// later state at once); space used by removed files still open, or by directory entries.
//
// Files are flat: a name is a valid io/fs path without a slash. The zero MemFS is an empty file
// system, ready to use. A MemFS and its files are safe for concurrent use.
type MemFS struct {
	mu      sync.Mutex
	files   map[string]*memNode // the directory as it reads
	durable map[string]*memNode // the directory as a crash leaves it: as of the last SyncDir
	epoch   uint64              // counts crashes: a memFile of an earlier epoch is crashed
	faults  memFaults
}

// memFaults are the errors a MemFS is set to inject.
type memFaults struct {
	write, sync, syncDir, read fault
	short                      float64 // the fraction of its bytes a failing write writes; < 0: none
	syncFailure                SyncFailure
	limited                    bool  // Write fails with ErrNoSpace past capacity
	capacity                   int64 // the bytes the directory's files may hold together
}

// fault is an error to return from an operation of a kind, after a count of them succeeded.
type fault struct {
	armed bool
	after int // operations left to succeed
	err   error
}

// arm sets the fault to fail the (after+1)-th operation from now with err, or cancels it if after
// is negative.
func (f *fault) arm(after int, err error) {
	if after >= 0 && err == nil {
		panic("wal: MemFS fault with a nil error")
	}
	*f = fault{armed: after >= 0, after: after, err: err}
}

// next counts an operation and returns the error to fail it with, or nil.
func (f *fault) next() error {
	if !f.armed {
		return nil
	}
	if f.after > 0 {
		f.after--
		return nil
	}
	f.armed = false
	return f.err
}

// memNode is a file's contents. data[:synced] is durable. When a Truncate since the last Sync cut
// into durable bytes, cut holds the bytes it cut, which a crash may bring back: the durable image
// is then data[:synced] followed by cut.
type memNode struct {
	data   []byte
	synced int
	cut    []byte
}

// image returns a copy of the file's durable image, never nil.
func (n *memNode) image() []byte {
	return append(append([]byte{}, n.data[:n.synced]...), n.cut...)
}

// crashed returns what a power loss leaves of the file under mode, a new slice.
func (n *memNode) crashed(mode CrashMode, rng *rand.Rand) []byte {
	if mode == KeepSynced || len(n.cut) > 0 && rng.IntN(2) == 0 {
		return n.image() // the Truncate did not reach the disk, nor what came after it
	}
	unsynced := len(n.data) - n.synced
	var keep int
	switch rng.IntN(4) {
	case 0:
	case 1:
		keep = unsynced
	default:
		keep = rng.IntN(unsynced + 1)
	}
	out := append([]byte{}, n.data[:n.synced+keep]...)
	if mode == TornTail && keep > 0 {
		torn := out[n.synced:]
		i := rng.IntN(keep)
		run := torn[i : i+1+rng.IntN(keep-i)]
		if rng.IntN(2) == 0 {
			clear(run)
		} else {
			for j := range run {
				run[j] = byte(rng.Uint32())
			}
		}
	}
	return out
}

// NewMemFS returns an empty MemFS, as the zero MemFS is.
func NewMemFS() *MemFS { return &MemFS{} }

// Create implements FS. Its name is not durable until SyncDir.
func (m *MemFS) Create(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := checkName("open", name); err != nil {
		return nil, err
	}
	if _, ok := m.files[name]; ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	}
	if m.files == nil {
		m.files = make(map[string]*memNode)
	}
	n := &memNode{}
	m.files[name] = n
	return &memFile{m: m, node: n, name: name, epoch: m.epoch}, nil
}

// Open implements FS.
func (m *MemFS) Open(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("open", name)
	if err != nil {
		return nil, err
	}
	return &memFile{m: m, node: n, name: name, epoch: m.epoch}, nil
}

// Remove implements FS. The removal is not durable until SyncDir; the files open on the name
// stay usable, as on Unix.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.lookup("remove", name); err != nil {
		return err
	}
	delete(m.files, name)
	return nil
}

// lookup returns the named file in the directory, or the error of op on it; m.mu held.
func (m *MemFS) lookup(op, name string) (*memNode, error) {
	if err := checkName(op, name); err != nil {
		return nil, err
	}
	n, ok := m.files[name]
	if !ok {
		return nil, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	return n, nil
}

// checkName returns the error of op on name if name is not a flat file's, or nil.
func checkName(op, name string) error {
	if !fs.ValidPath(name) || name == "." || strings.Contains(name, "/") {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return nil
}

// List implements FS.
func (m *MemFS) List() ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.files)), nil
}

// SyncDir implements FS: the directory's entries as they are now survive a crash. If it fails
// (FailSyncDir), nothing is made durable.
func (m *MemFS) SyncDir() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.faults.syncDir.next(); err != nil {
		return &fs.PathError{Op: "sync", Path: ".", Err: err}
	}
	m.durable = maps.Clone(m.files)
	return nil
}

// Crash simulates a crash and a reboot (the MemFS doc says what survives): every File open now
// fails with ErrCrashed from then on, and m is as the crash left it, usable. Under KeepPrefix and
// TornTail, rng decides what a crash keeps; it may be nil under KeepSynced and KeepWritten.
// Capacity and pending faults are unchanged.
func (m *MemFS) Crash(mode CrashMode, rng *rand.Rand) {
	if mode < KeepSynced || mode > KeepWritten {
		panic(fmt.Sprintf("wal: MemFS.Crash: unknown mode %v", mode))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.epoch++
	if mode == KeepWritten {
		return
	}
	files := make(map[string]*memNode, len(m.durable))
	for _, name := range slices.Sorted(maps.Keys(m.durable)) {
		data := m.durable[name].crashed(mode, rng)
		files[name] = &memNode{data: data, synced: len(data)}
	}
	m.files, m.durable = files, maps.Clone(files)
}

// FailWrite makes the (after+1)-th Write from now, to any file, fail with an error wrapping err;
// the writes before and after it are unaffected. If rng is nil the failing write writes nothing;
// otherwise it is a short write, as write(2) cut short by an I/O error: it first appends a
// prefix of its bytes, possibly empty and never all, whose share of them is drawn from rng now
// (rng is not used after FailWrite returns), and returns its length. A FailWrite replaces the
// pending one; a negative after cancels it.
func (m *MemFS) FailWrite(after int, err error, rng *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults.write.arm(after, err)
	m.faults.short = -1
	if rng != nil {
		m.faults.short = rng.Float64()
	}
}

// FailSync makes the (after+1)-th File.Sync from now, of any file, fail with an error wrapping
// err. A failed Sync makes nothing durable; what it does to the unsynced bytes is failure's. A
// FailSync replaces the pending one; a negative after cancels it.
func (m *MemFS) FailSync(after int, err error, failure SyncFailure) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults.sync.arm(after, err)
	m.faults.syncFailure = failure
}

// FailSyncDir makes the (after+1)-th SyncDir from now fail with an error wrapping err, making
// nothing durable. A FailSyncDir replaces the pending one; a negative after cancels it.
func (m *MemFS) FailSyncDir(after int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults.syncDir.arm(after, err)
}

// FailRead makes the (after+1)-th ReadAt from now, of any file, fail with an error wrapping err,
// reading nothing. A FailRead replaces the pending one; a negative after cancels it.
func (m *MemFS) FailRead(after int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults.read.arm(after, err)
}

// Capacity limits the bytes the files in the directory may hold together to n: a Write that
// would pass it writes what fits and fails with an error wrapping ErrNoSpace, as write(2) on a
// full disk. A negative n lifts the limit (the zero MemFS has none). Removing or truncating
// files makes room; Truncate never fails for want of it.
func (m *MemFS) Capacity(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults.limited, m.faults.capacity = n >= 0, n
}

// Used returns the bytes the directory's files hold together: what Capacity limits.
func (m *MemFS) Used() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used()
}

// Contents returns a copy of what the named file reads now, or nil if the directory has no such
// file (an empty file's contents are empty, not nil).
func (m *MemFS) Contents(name string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.files[name]; ok {
		return append([]byte{}, n.data...)
	}
	return nil
}

// Synced returns a copy of the named file's durable bytes, which its last Sync (or the last
// crash) left on the disk, or nil if the directory has no such file: what a crash under
// KeepSynced leaves of the file, if the file's name is durable. It says nothing of the name: see
// SyncDir.
func (m *MemFS) Synced(name string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.files[name]; ok {
		return n.image()
	}
	return nil
}

// Clone returns a copy of m: its files, what of them is durable, its capacity and pending faults.
// The files open on m are not open on the copy. It lets a test crash one state in several ways.
func (m *MemFS) Clone() *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := &MemFS{faults: m.faults}
	copies := make(map[*memNode]*memNode)
	clone := func(dir map[string]*memNode) map[string]*memNode {
		if dir == nil {
			return nil
		}
		out := make(map[string]*memNode, len(dir))
		for name, n := range dir {
			if copies[n] == nil {
				copies[n] = &memNode{data: slices.Clone(n.data), synced: n.synced, cut: slices.Clone(n.cut)}
			}
			out[name] = copies[n]
		}
		return out
	}
	c.files, c.durable = clone(m.files), clone(m.durable)
	return c
}

// used returns the bytes the directory's files hold; m.mu held.
func (m *MemFS) used() int64 {
	var total int64
	for _, n := range m.files {
		total += int64(len(n.data))
	}
	return total
}

// memFile is a File of a MemFS: a handle on a file, usable until it is closed or the MemFS
// crashes.
type memFile struct {
	m      *MemFS
	node   *memNode
	name   string
	epoch  uint64 // the MemFS's when the file was opened
	closed bool
}

// lock locks f's MemFS and returns nil if f is usable, or else unlocks it and returns the error of
// op on f.
func (f *memFile) lock(op string) error {
	f.m.mu.Lock()
	var err error
	switch {
	case f.closed:
		err = fs.ErrClosed
	case f.epoch != f.m.epoch:
		err = ErrCrashed
	default:
		return nil
	}
	f.m.mu.Unlock()
	return &fs.PathError{Op: op, Path: f.name, Err: err}
}

// ReadAt implements io.ReaderAt.
func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.lock("read"); err != nil {
		return 0, err
	}
	defer f.m.mu.Unlock()
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: fs.ErrInvalid}
	}
	if err := f.m.faults.read.next(); err != nil {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: err}
	}
	data := f.node.data
	if off >= int64(len(data)) {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := copy(p, data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Write implements File. It fails as MemFS.FailWrite and MemFS.Capacity say; a write that fails
// returns how many of its bytes it appended.
func (f *memFile) Write(p []byte) (int, error) {
	if err := f.lock("write"); err != nil {
		return 0, err
	}
	defer f.m.mu.Unlock()
	faults := &f.m.faults
	n := len(p)
	err := faults.write.next()
	if err != nil {
		n = 0
		if faults.short >= 0 {
			n = int(faults.short * float64(len(p)))
		}
	}
	if faults.limited {
		if room := max(faults.capacity-f.m.used(), 0); int64(n) > room {
			n = int(room)
			if err == nil {
				err = ErrNoSpace
			}
		}
	}
	f.node.data = append(f.node.data, p[:n]...)
	if err != nil {
		return n, &fs.PathError{Op: "write", Path: f.name, Err: err}
	}
	return n, nil
}

// Sync implements File. If it fails (MemFS.FailSync), nothing is made durable.
func (f *memFile) Sync() error {
	if err := f.lock("sync"); err != nil {
		return err
	}
	defer f.m.mu.Unlock()
	n := f.node
	if err := f.m.faults.sync.next(); err != nil {
		if f.m.faults.syncFailure == DropUnsynced {
			n.data = n.data[:n.synced]
		}
		return &fs.PathError{Op: "sync", Path: f.name, Err: err}
	}
	n.synced, n.cut = len(n.data), nil
	return nil
}

// Truncate implements File: a larger size extends the file with zeros. It is durable only after
// a Sync (see MemFS).
func (f *memFile) Truncate(size int64) error {
	if err := f.lock("truncate"); err != nil {
		return err
	}
	defer f.m.mu.Unlock()
	n := f.node
	switch {
	case size < 0:
		return &fs.PathError{Op: "truncate", Path: f.name, Err: fs.ErrInvalid}
	case size > int64(len(n.data)):
		n.data = append(n.data, make([]byte, size-int64(len(n.data)))...)
	default:
		if s := int(size); s < n.synced {
			n.cut = append(slices.Clone(n.data[s:n.synced]), n.cut...)
			n.synced = s
		}
		n.data = n.data[:size]
	}
	return nil
}

// Size implements File.
func (f *memFile) Size() (int64, error) {
	if err := f.lock("stat"); err != nil {
		return 0, err
	}
	defer f.m.mu.Unlock()
	return int64(len(f.node.data)), nil
}

// Close implements File. Closing is not syncing.
func (f *memFile) Close() error {
	if err := f.lock("close"); err != nil {
		return err
	}
	defer f.m.mu.Unlock()
	f.closed = true
	return nil
}

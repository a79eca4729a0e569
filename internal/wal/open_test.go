package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Recovery (open.go): a torn end is cut, damage is refused or, with Salvage, skipped and
// counted; the log knows where it starts and where it ends.

// corrupt flips one byte of a segment file at offset off (from the end when negative).
func corrupt(t *testing.T, fs OSFS, seg uint64, off int64) {
	t.Helper()
	path := filepath.Join(fs.Dir, segmentName(seg))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	if off < 0 {
		off += int64(len(data))
	}
	data[off] ^= 0x40
	require.NoError(t, os.WriteFile(path, data, 0o644))
}

func TestLogTornTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		tear func(t *testing.T, path string)
	}{
		{"half a batch", func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(path, data[:len(data)-5], 0o644))
		}},
		{"garbage", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.Write([]byte{200, 1, 0, 0, 9, 9, 9, 9, 1, 2, 3})
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{"zeros", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.Write(make([]byte, 4096))
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{"a flipped bit in the last batch", func(t *testing.T, path string) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			data[len(data)-3] ^= 1
			require.NoError(t, os.WriteFile(path, data, 0o644))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := OSFS{Dir: t.TempDir()}
			l, _, _ := openLog(t, fs, Options{})
			appendAll(t, l, 0, 50, 10)
			crash(t, l)
			tc.tear(t, filepath.Join(fs.Dir, segmentName(1)))

			l, r, rec := openLog(t, fs, Options{})
			require.Len(t, rec.Cut, 1, "a torn tail is reported")
			require.Equal(t, segmentName(1), rec.Cut[0].File)
			want := 50
			if tc.name != "garbage" && tc.name != "zeros" {
				want = 40 // the last batch was torn
			}
			requireRecords(t, r, want)
			appendAll(t, l, want, want+10, 5)
			require.NoError(t, l.Close())
			_, r, rec = openLog(t, fs, Options{})
			require.Empty(t, rec.Cut, "cut once, clean after")
			requireRecords(t, r, want+10)
		})
	}
}

func TestLogCorruption(t *testing.T) {
	// setup writes 200 records in segments of 2 KiB, and closes the log, or crashes it.
	setup := func(t *testing.T, mode SyncMode, close bool) OSFS {
		fs := OSFS{Dir: t.TempDir()}
		l, _, _ := openLog(t, fs, Options{Sync: mode, SegmentSize: 2048})
		appendAll(t, l, 0, 200, 4)
		if close {
			require.NoError(t, l.Close())
		} else {
			crash(t, l)
		}
		return fs
	}
	lastWithBatches := func(t *testing.T, fs OSFS) uint64 {
		names, err := fs.List()
		require.NoError(t, err)
		for i := len(names) - 1; ; i-- {
			n, _ := segmentNumber(names[i])
			if info, err := os.Stat(filepath.Join(fs.Dir, names[i])); err == nil && info.Size() > headerSize {
				return n
			}
		}
	}
	t.Run("an earlier segment", func(t *testing.T) {
		fs := setup(t, SyncAlways, true)
		corrupt(t, fs, 2, headerSize+frameSize+3)
		_, _, err := Open(fs, Options{}, func(uint64, []byte) error { return nil })
		require.ErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, segmentName(2))
		require.ErrorContains(t, err, fmt.Sprintf("offset %d", headerSize))

		l, r, rec := openLog(t, fs, Options{Salvage: true})
		require.Len(t, rec.Skipped, 1)
		require.Equal(t, segmentName(2), rec.Skipped[0].File)
		require.Equal(t, 4, rec.Skipped[0].Records, "one batch of 4 records lost")
		require.Len(t, r.recs, 196, "the rest kept")
		require.NoError(t, l.Close())
	})
	for _, close := range []bool{true, false} {
		for _, mode := range []SyncMode{SyncAlways, SyncNever} {
			t.Run(fmt.Sprintf("the last segment, before good batches/closed=%v/%v", close, mode), func(t *testing.T) {
				fs := setup(t, mode, close)
				corrupt(t, fs, lastWithBatches(t, fs), headerSize+frameSize+3)
				if close || mode == SyncAlways {
					// Synced: a clean Close seals the segment, and under SyncAlways the later
					// batches say they were written after it was synced.
					_, _, err := Open(fs, Options{}, func(uint64, []byte) error { return nil })
					require.ErrorIs(t, err, ErrCorrupt)
					return
				}
				// Nothing says it was synced: a power loss can leave that, and it is cut.
				l, r, rec := openLog(t, fs, Options{})
				require.Len(t, rec.Cut, 1, "cut at the damage, as after a power loss")
				require.Equal(t, int64(headerSize), rec.Cut[0].Offset)
				require.Positive(t, rec.Cut[0].GoodAfter, "and the batches after it are counted")
				require.Less(t, len(r.recs), 200)
				requireRecords(t, r, len(r.recs))
				require.NoError(t, l.Close())
			})
		}
	}
	t.Run("a bad header", func(t *testing.T) {
		fs := setup(t, SyncAlways, true)
		corrupt(t, fs, 1, 9) // the segment number
		_, _, err := Open(fs, Options{}, func(uint64, []byte) error { return nil })
		require.ErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, segmentName(1))

		l, r, rec := openLog(t, fs, Options{Salvage: true})
		require.Len(t, rec.Skipped, 1, "Salvage gets past it")
		require.Zero(t, rec.Skipped[0].Records)
		requireRecords(t, r, 200)
		require.NoError(t, l.Close())
	})
	for _, mode := range []SyncMode{SyncAlways, SyncNever} {
		t.Run(fmt.Sprint("a bad header of the last segment after a crash/", mode), func(t *testing.T) {
			fs := setup(t, mode, false)
			last := lastWithBatches(t, fs)
			corrupt(t, fs, last, 3) // the magic
			if mode == SyncAlways {
				_, _, err := Open(fs, Options{}, func(uint64, []byte) error { return nil })
				require.ErrorIs(t, err, ErrCorrupt, "its batches say it was synced")
				return
			}
			// Nothing in it was synced (a sync covers the header): it is cut, not refused.
			l, r, rec := openLog(t, fs, Options{})
			require.Len(t, rec.Cut, 1)
			require.Equal(t, int64(0), rec.Cut[0].Offset)
			require.Positive(t, rec.Cut[0].GoodAfter)
			require.Less(t, len(r.recs), 200)
			appendAll(t, l, len(r.recs), len(r.recs)+10, 5)
			require.NoError(t, l.Close())
			_, r2, rec := openLog(t, fs, Options{})
			require.Empty(t, rec.Cut, "written again with a header")
			requireRecords(t, r2, len(r.recs)+10)
		})
	}
	t.Run("replay fails", func(t *testing.T) {
		fs := setup(t, SyncAlways, true)
		boom := errors.New("boom")
		_, _, err := Open(fs, Options{}, func(uint64, []byte) error { return boom })
		require.ErrorIs(t, err, boom)
	})
}

// FuzzRecover: whatever a segment holds, Open returns an error or records, and never panics;
// what it returns once it opens again (after cutting a torn tail) is what it returned the
// first time.
func FuzzRecover(f *testing.F) {
	fs := OSFS{Dir: f.TempDir()}
	l, _, err := Open(fs, Options{}, func(uint64, []byte) error { return nil })
	if err != nil {
		f.Fatal(err)
	}
	for i := range 5 {
		lsn, _, _ := l.Append(record(i), record(i+1))
		if err := l.Wait(f.Context(), lsn); err != nil {
			f.Fatal(err)
		}
	}
	crash(f, l) // not sealed: the segment is the last one, as after a crash
	good, err := os.ReadFile(filepath.Join(fs.Dir, segmentName(1)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good, false)
	f.Add(good[:len(good)-7], false)
	f.Add(append(bytes.Clone(good), 1, 2, 3), true)
	f.Add(good[:headerSize], false)
	f.Fuzz(func(t *testing.T, data []byte, salvage bool) {
		fs := NewMemFS()
		seg, err := fs.Create(segmentName(1))
		require.NoError(t, err)
		_, err = seg.Write(data)
		require.NoError(t, err)
		require.NoError(t, seg.Close())
		var first replayed
		l, _, err := Open(fs, Options{Salvage: salvage}, first.add)
		if errors.Is(err, ErrVersion) {
			return // a segment of format 1
		}
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		require.NoError(t, l.Close())
		var again replayed
		l, rec, err := Open(fs, Options{Salvage: salvage}, again.add)
		require.NoError(t, err)
		require.Empty(t, rec.Cut)
		require.Equal(t, first.recs, again.recs)
		require.NoError(t, l.Close())
	})
}

// requireInOrder checks that r holds records made by record, each once, in order: some of them
// may be missing.
func requireInOrder(t *testing.T, r *replayed) {
	t.Helper()
	last := -1
	for _, rec := range r.recs {
		var i int
		_, err := fmt.Sscanf(string(rec), "record %d", &i)
		require.NoError(t, err)
		require.Greater(t, i, last, "in order, once")
		require.Equal(t, record(i), rec)
		last = i
	}
}

// copyDir copies the files of src into a new directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644))
	}
	return dst
}

// snapshot returns the files of dir and their contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		files[e.Name()] = string(data)
	}
	return files
}

// damageKinds are the ways a test damages a segment file on the real file system.
var damageKinds = []struct {
	name   string
	damage func(t *testing.T, path string)
}{
	{"flip", func(t *testing.T, path string) {
		editFile(t, path, func(b []byte) []byte { b[len(b)/2] ^= 0x10; return b })
	}},
	{"zero", func(t *testing.T, path string) {
		editFile(t, path, func(b []byte) []byte { clear(b[len(b)/2 : min(len(b), len(b)/2+64)]); return b })
	}},
	{"truncate", func(t *testing.T, path string) { editFile(t, path, func(b []byte) []byte { return b[:len(b)/2] }) }},
	{"delete", func(t *testing.T, path string) { require.NoError(t, os.Remove(path)) }},
	{"header", func(t *testing.T, path string) { editFile(t, path, func(b []byte) []byte { b[20] ^= 0x01; return b }) }},
}

// editFile rewrites the file at path with what edit makes of its contents.
func editFile(t *testing.T, path string, edit func([]byte) []byte) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, edit(data), 0o644))
}

// TestOpenDamage: a log closed cleanly (so every segment that holds a record is sealed), on the
// real file system, damaged in each way (a flipped byte, a run of zeros, the file cut in half,
// the file deleted, a flipped byte in its header) at each place (the first segment, a middle
// one, the last one holding records, the empty one Close leaves after it). Without Salvage,
// Open loses no record: it fails with ErrCorrupt, naming the file, and leaves the directory as
// it was; or, when the damage held no record (the empty segment's header), it opens with every
// record. With Salvage it opens, hands every record but those of the damage, in order, and the
// Recovery counts exactly the records it dropped.
func TestOpenDamage(t *testing.T) {
	const total = 3000
	src := t.TempDir()
	l, _, _ := openLog(t, OSFS{Dir: src}, Options{Sync: SyncNever, SegmentSize: 8 << 10})
	appendAll(t, l, 0, total, 5)
	require.NoError(t, l.Close())
	names, err := OSFS{Dir: src}.List()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(names), 7)
	empty := names[len(names)-1]
	info, err := os.Stat(filepath.Join(src, empty))
	require.NoError(t, err)
	require.EqualValues(t, headerSize, info.Size(), "Close leaves an empty segment after the last")
	places := []struct{ name, file string }{
		{"first", names[0]},
		{"middle", names[len(names)/2]},
		{"last", names[len(names)-2]},
		{"empty last", empty},
	}

	for _, place := range places {
		for _, kind := range damageKinds {
			t.Run(place.name+"/"+kind.name, func(t *testing.T) {
				dir := copyDir(t, src)
				kind.damage(t, filepath.Join(dir, place.file))
				before := snapshot(t, dir)

				var r replayed
				l, rec, err := Open(OSFS{Dir: dir}, Options{}, r.add)
				harmless := place.file == empty && kind.name != "delete"
				if harmless {
					require.NoError(t, err, "the empty segment held nothing")
					requireRecords(t, &r, total)
					require.Len(t, rec.Cut, 1, "its bad header is cut")
					require.NoError(t, l.Close())
					return
				}
				require.ErrorIs(t, err, ErrCorrupt)
				require.ErrorContains(t, err, place.file)
				require.Equal(t, before, snapshot(t, dir), "a failed Open writes nothing")

				r = replayed{}
				l, rec, err = Open(OSFS{Dir: dir}, Options{Salvage: true}, r.add)
				require.NoError(t, err)
				require.NotEmpty(t, rec.Skipped)
				requireInOrder(t, &r)
				dropped := 0
				for _, d := range rec.Skipped {
					if place.file == empty { // deleted: the log cannot tell what it held
						require.Equal(t, -1, d.Records)
						continue
					}
					require.GreaterOrEqual(t, d.Records, 0, "%+v", d)
					dropped += d.Records
				}
				require.Equal(t, total-len(r.recs), dropped, "the records dropped, exactly: %+v", rec.Skipped)
				require.NoError(t, l.Close())
			})
		}
	}
}

// hookFS is a MemFS whose SyncDir, once armed, calls crash after it.
type hookFS struct {
	*MemFS
	armed atomic.Bool
	crash func()
}

func (fs *hookFS) SyncDir() error {
	err := fs.MemFS.SyncDir()
	if fs.armed.CompareAndSwap(true, false) {
		fs.crash()
	}
	return err
}

// TestOpenAfterCrashDuringRotation: a power loss while the log moves to a new segment, after
// the new segment's name is durable and before the old one is sealed, leaves an unsealed
// segment, maybe torn, and an empty one after it. Open finishes the move: it keeps every
// confirmed record (under SyncAlways), counts the records the crash took, and the log goes on
// and opens clean after.
func TestOpenAfterCrashDuringRotation(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncNever} {
		for _, crash := range []CrashMode{KeepSynced, TornTail} {
			t.Run(fmt.Sprint(mode, "/", crash), func(t *testing.T) {
				for seed := range uint64(30) {
					rng := rand.New(rand.NewPCG(seed, 9))
					fs := &hookFS{MemFS: NewMemFS()}
					fs.crash = func() { fs.Crash(crash, rng) }
					opts := Options{Sync: mode, SegmentSize: 2048, FlushDelay: time.Hour}
					l, _, _ := openLog(t, fs, opts)
					run := &crashRun{l: l}
					for range 1 + rng.IntN(30) {
						run.batch(t, rng)
					}
					fs.armed.Store(true) // at the next segment's creation
					for {
						lsn, _, err := l.Append(record(run.appended))
						if err == nil {
							err = l.Wait(t.Context(), lsn)
						}
						if err != nil {
							require.ErrorIs(t, err, ErrFailed, "crashed")
							break
						}
						run.appended++
						run.confirmed = run.appended
					}
					l.Close()
					names, err := fs.List()
					require.NoError(t, err)
					last, _ := segmentNumber(names[len(names)-1])
					require.False(t, sealed(fs.MemFS, last-1), "seed %d: the crash came before the seal", seed)

					l, r, rec := openLog(t, fs, opts)
					require.True(t, sealed(fs.MemFS, last-1), "seed %d: Open finished the move", seed)
					requireRecords(t, r, len(r.recs))
					if mode == SyncAlways {
						require.GreaterOrEqual(t, len(r.recs), run.confirmed, "seed %d: a confirmed record is lost", seed)
					}
					require.Empty(t, rec.Skipped)
					for _, d := range rec.Cut {
						if d.Records > 0 {
							require.LessOrEqual(t, d.Records, run.appended-len(r.recs), "seed %d", seed)
						}
					}
					appendAll(t, l, len(r.recs), len(r.recs)+20, 3)
					require.NoError(t, l.Close())
					_, r2, rec := openLog(t, fs, opts)
					require.Empty(t, rec.Cut, "seed %d", seed)
					requireRecords(t, r2, len(r.recs)+20)
				}
			})
		}
	}
}

// sealed reports whether segment n of fs ends with a seal.
func sealed(fs *MemFS, n uint64) bool {
	data := fs.Contents(segmentName(n))
	kind := batchData
	for off := int64(headerSize); off < int64(len(data)); {
		b, ok := batchAt(data, off, n)
		if !ok {
			return false
		}
		kind, off = b.kind, b.next
	}
	return kind == batchSeal
}

// TestOpenStart: the log knows where it starts. Segments released and removed are not taken
// for missing; released segments a crash left behind (with a gap between them, as a file
// system that reorders removals can leave) are not read, and go; a deleted first segment is
// corruption, whose records Salvage counts.
func TestOpenStart(t *testing.T) {
	fs := NewMemFS()
	opts := Options{SegmentSize: 1024}
	l, _, _ := openLog(t, fs, opts)
	segs, _ := appendEach(t, l, 0, 300)
	released := map[string][]byte{}
	for _, n := range []uint64{2, 4} {
		released[segmentName(n)] = fs.Contents(segmentName(n))
	}
	l.ReleaseBelow(6)
	require.NoError(t, l.Sync())
	require.NoError(t, l.Close())
	first := 0
	for segs[first] < 6 {
		first++
	}

	_, r, rec := openLog(t, fs, opts)
	require.Empty(t, rec.Skipped)
	require.Equal(t, uint64(6), r.segs[0], "the log starts at segment 6")
	require.Len(t, r.recs, 300-first)

	t.Run("released segments left behind", func(t *testing.T) {
		fs := fs.Clone()
		for name, data := range released {
			f, err := fs.Create(name)
			require.NoError(t, err)
			_, err = f.Write(data)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}
		l, r, rec := openLog(t, fs, opts)
		require.Empty(t, rec.Skipped)
		require.Equal(t, uint64(6), r.segs[0], "not read")
		require.NoError(t, l.Sync())
		names, err := fs.List()
		require.NoError(t, err)
		require.NotContains(t, names, segmentName(2), "removed")
		require.NotContains(t, names, segmentName(4), "removed")
		require.NoError(t, l.Close())
	})
	t.Run("the first segment deleted", func(t *testing.T) {
		fs := fs.Clone()
		require.NoError(t, fs.Remove(segmentName(6)))
		_, _, err := Open(fs, opts, func(uint64, []byte) error { return nil })
		require.ErrorIs(t, err, ErrCorrupt)
		require.ErrorContains(t, err, segmentName(6))

		l, r, rec := openLog(t, fs, Options{SegmentSize: 1024, Salvage: true})
		require.Len(t, rec.Skipped, 1)
		require.True(t, rec.Skipped[0].Missing)
		in6 := 0
		for _, s := range segs {
			if s == 6 {
				in6++
			}
		}
		require.Equal(t, in6, rec.Skipped[0].Records, "the records of segment 6")
		require.Len(t, r.recs, 300-first-in6)
		require.NoError(t, l.Close())
	})
}

// TestOpenFormat1: a log written by the format before this one is refused with ErrVersion,
// with or without Salvage, and left as it was.
func TestOpenFormat1(t *testing.T) {
	fs := NewMemFS()
	seg := make([]byte, 16, 64)
	copy(seg, "WARRENW1")
	binary.LittleEndian.PutUint64(seg[8:], 1)
	recs := binary.AppendUvarint(nil, 3)
	recs = append(recs, "abc"...)
	seg = binary.LittleEndian.AppendUint32(seg, uint32(len(recs)))
	seg = binary.LittleEndian.AppendUint32(seg, checksum(1, 16, recs))
	seg = append(seg, recs...)
	f, err := fs.Create(segmentName(1))
	require.NoError(t, err)
	_, err = f.Write(seg)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	for _, salvage := range []bool{false, true} {
		_, _, err := Open(fs, Options{Salvage: salvage}, func(uint64, []byte) error { return nil })
		require.ErrorIs(t, err, ErrVersion)
		require.ErrorContains(t, err, segmentName(1))
		require.Equal(t, seg, fs.Contents(segmentName(1)))
	}
}

// FuzzDamagedSegments: a log closed cleanly, in several segments, with one of them damaged (a
// run of bytes flipped, its end cut off, or the file deleted). Without Salvage, Open fails with
// ErrCorrupt, or opens with every record. With it, Open opens and hands the records but those
// of the damage, in order, and the records it says it skipped, when it can count them, are
// exactly those missing.
func FuzzDamagedSegments(f *testing.F) {
	const total = 200
	base := NewMemFS()
	l, _, err := Open(base, Options{SegmentSize: 1024, Sync: SyncNever}, func(uint64, []byte) error { return nil })
	if err != nil {
		f.Fatal(err)
	}
	appendAll(f, l, 0, total, 3)
	if err := l.Close(); err != nil {
		f.Fatal(err)
	}
	names, _ := base.List()
	f.Add(uint8(0), uint16(100), uint8(1), uint8(1), uint16(0), false)
	f.Add(uint8(3), uint16(20), uint8(0xff), uint8(4), uint16(0), false)
	f.Add(uint8(5), uint16(0), uint8(0), uint8(0), uint16(300), false)
	f.Add(uint8(1), uint16(0), uint8(0), uint8(0), uint16(0), true)
	f.Add(uint8(255), uint16(3), uint8(0x40), uint8(2), uint16(0), false)
	f.Fuzz(func(t *testing.T, file uint8, off uint16, mask, run uint8, cut uint16, remove bool) {
		fs := base.Clone()
		name := names[int(file)%len(names)]
		if remove {
			require.NoError(t, fs.Remove(name))
		} else {
			data := fs.Contents(name)
			for i := int(off); i < int(off)+int(run) && i < len(data); i++ {
				data[i] ^= mask
			}
			require.NoError(t, fs.Remove(name))
			seg, err := fs.Create(name)
			require.NoError(t, err)
			_, err = seg.Write(data[:len(data)-min(len(data), int(cut))])
			require.NoError(t, err)
			require.NoError(t, seg.Close())
		}

		var r replayed
		l, _, err := Open(fs.Clone(), Options{}, r.add)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
		} else {
			requireRecords(t, &r, total)
			require.NoError(t, l.Close())
		}

		r = replayed{}
		l, rec, err := Open(fs, Options{Salvage: true}, r.add)
		require.NoError(t, err)
		requireInOrder(t, &r)
		counted, dropped := true, 0
		for _, d := range rec.Skipped {
			counted = counted && d.Records >= 0
			dropped += d.Records
		}
		for _, d := range rec.Cut {
			counted = counted && d.Records >= 0
			dropped += d.Records
		}
		if counted {
			require.Equal(t, total-len(r.recs), dropped, "%+v", rec)
		}
		require.NoError(t, l.Close())
	})
}

// TestOpenResume: Open resumes at the first of Options.ResumeAt still in the log: it hands
// replay the records from there on only, Scan still reads those before, and the log goes on. A
// mark whose segment was released, or that another log numbers otherwise, is passed over; a
// missing segment or a damaged header before the mark fails Open as without one.
func TestOpenResume(t *testing.T) {
	fs := NewMemFS()
	opts := Options{SegmentSize: 1024}
	l, _, _ := openLog(t, fs, opts)
	first := l.MarkNow()
	segs, _ := appendEach(t, l, 0, 200)
	mark := l.MarkNow()
	require.Equal(t, segs[199], mark.Seg, "the segment being written")
	require.Greater(t, mark.Record, uint64(150))
	appendEach(t, l, 200, 260)
	require.NoError(t, l.Close())
	from := func(t *testing.T, r *replayed, n uint64) {
		t.Helper()
		require.Len(t, r.recs, int(260-n))
		for i, rec := range r.recs {
			require.Equal(t, record(int(n)+i), rec)
		}
	}

	resume := opts
	require.Equal(t, int(mark.Seg-mark.Start), len(mark.Firsts), "the log knows every segment's first record")
	resume.ResumeAt = []Mark{{Seg: mark.Seg, Record: mark.Record + 1}, mark, first}
	t.Run("resumed", func(t *testing.T) {
		fs := fs.Clone()
		var told []Mark
		o := resume
		o.OnResume = func(m Mark) { told = append(told, m) }
		l, r, rec := openLog(t, fs, o)
		require.True(t, rec.Resumed)
		require.Equal(t, mark, rec.ResumedAt, "the first that is in the log: the one before numbers otherwise")
		require.Equal(t, []Mark{mark}, told)
		from(t, r, mark.Record)
		var scanned int
		require.NoError(t, l.Scan(t.Context(), segs[0], 0, func(uint64, []byte) bool { scanned++; return true }))
		require.Equal(t, 260, scanned, "what is before the mark can be read back")
		appendAll(t, l, 260, 300, 7)
		require.NoError(t, l.Close())
		_, r, rec = openLog(t, fs, opts)
		require.False(t, rec.Resumed)
		requireRecords(t, r, 300)
	})
	t.Run("released", func(t *testing.T) {
		fs := fs.Clone()
		l, _, _ := openLog(t, fs, opts)
		l.ReleaseBelow(mark.Seg + 1)
		appendAll(t, l, 260, 300, 7) // a synced batch says where the log starts
		require.NoError(t, l.Close())
		o := opts
		o.ResumeAt = []Mark{mark, first}
		_, r, rec := openLog(t, fs, o)
		require.False(t, rec.Resumed, "both marks were released")
		require.NotEmpty(t, r.recs)
	})
	t.Run("a segment before the mark is gone", func(t *testing.T) {
		fs := fs.Clone()
		require.NoError(t, fs.Remove(segmentName(segs[100])))
		_, _, err := Open(fs, resume, func(uint64, []byte) error { return nil })
		require.ErrorIs(t, err, ErrCorrupt, "read whole: the missing segment is corruption")
	})
	t.Run("first records known: no header read", func(t *testing.T) {
		var read readStats
		l, r, rec := openLog(t, countingFS{FS: fs.Clone(), read: &read}, resume)
		require.True(t, rec.Resumed)
		from(t, r, mark.Record)
		names, err := fs.List()
		require.NoError(t, err)
		after := int64(0) // the segments from the mark on: those Open reads
		for _, name := range names {
			if n, ok := segmentNumber(name); ok && n >= mark.Seg {
				after++
			}
		}
		require.Greater(t, int64(mark.Seg), after+8)
		require.LessOrEqual(t, read.opens.Load(), after+4, "the segments from the mark on, not the %d before it", mark.Seg-1)
		require.NoError(t, l.Close())
	})
	t.Run("a damaged header before the mark", func(t *testing.T) {
		fs := fs.Clone()
		resume := opts
		resume.ResumeAt = []Mark{{Seg: mark.Seg, Record: mark.Record}} // headers read: the damage is found
		name := segmentName(segs[100])
		data := fs.Contents(name)
		data[20] ^= 1
		require.NoError(t, fs.Remove(name))
		f, err := fs.Create(name)
		require.NoError(t, err)
		_, err = f.Write(data)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		_, _, err = Open(fs, resume, func(uint64, []byte) error { return nil })
		require.ErrorIs(t, err, ErrCorrupt)
	})
}

package wal

import (
	"io"
	"os"
	"path/filepath"
	"slices"
)

// FS is what the log needs of a file system: a directory of flat files. OSFS is the real one;
// MemFS is a file system in memory for tests, which can crash and fail on demand.
type FS interface {
	// Create creates the named file, empty; it fails if it exists.
	Create(name string) (File, error)
	// Open opens the named file for reading and appending.
	Open(name string) (File, error)
	// Remove removes the named file.
	Remove(name string) error
	// List returns the names of the files in the directory, sorted.
	List() ([]string, error)
	// SyncDir makes the directory's entries durable: files created or removed since.
	SyncDir() error
}

// File is an open file of an FS.
type File interface {
	io.ReaderAt
	// Write appends p at the end of the file.
	Write(p []byte) (int, error)
	// Sync makes what was written durable.
	Sync() error
	// Truncate cuts the file to size bytes.
	Truncate(size int64) error
	// Size returns the file's size.
	Size() (int64, error)
	Close() error
}

// OSFS is the operating system's file system, rooted at a directory.
type OSFS struct {
	Dir string
}

// Create implements FS.
func (fs OSFS) Create(name string) (File, error) {
	f, err := os.OpenFile(filepath.Join(fs.Dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// Open implements FS.
func (fs OSFS) Open(name string) (File, error) {
	f, err := os.OpenFile(filepath.Join(fs.Dir, name), os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// Remove implements FS.
func (fs OSFS) Remove(name string) error { return os.Remove(filepath.Join(fs.Dir, name)) }

// List implements FS.
func (fs OSFS) List() ([]string, error) {
	entries, err := os.ReadDir(fs.Dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}

// SyncDir implements FS.
func (fs OSFS) SyncDir() error {
	d, err := os.Open(fs.Dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

type osFile struct{ f *os.File }

func (f osFile) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }
func (f osFile) Write(p []byte) (int, error)             { return f.f.Write(p) }
func (f osFile) Sync() error                             { return f.f.Sync() }
func (f osFile) Truncate(size int64) error               { return f.f.Truncate(size) }
func (f osFile) Close() error                            { return f.f.Close() }

func (f osFile) Size() (int64, error) {
	st, err := f.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

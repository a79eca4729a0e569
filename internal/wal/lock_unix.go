//go:build unix

package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// LockDir takes an exclusive lock on the directory dir, held until the returned file is
// closed (or the process ends): two logs written at once in one directory, by two processes or
// twice by one, would corrupt each other. It fails with ErrLocked when another holds it.
func LockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("wal: %s: %w", dir, ErrLocked)
		}
		return nil, fmt.Errorf("wal: locking %s: %w", dir, err)
	}
	return f, nil
}

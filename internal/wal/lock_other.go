//go:build !unix

package wal

import (
	"os"
	"path/filepath"
)

// LockDir opens the directory's lock file. Where flock(2) is missing it does not lock: the
// caller must not open one directory twice.
func LockDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
}

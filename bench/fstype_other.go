//go:build !linux

package bench

// FSType names the file system that holds dir: not known outside Linux.
func FSType(string) string { return "unknown" }

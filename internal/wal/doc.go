// Package wal is warren's write-ahead log: a segmented, append-only log of opaque records in a
// directory, with a checksum per batch, group commit, a sync policy, and recovery that cuts a
// torn end and refuses (or, salvaging, skips and counts) any other damage: what it writes says
// how far each segment was synced, where the log starts and where it ends (format.go, Open).
// Scan reads it back beside the writer, checked as Open checks it (read.go).
// It knows nothing of messages: the broker's store encodes its records. docs/DURABILITY.md has
// the design.
package wal

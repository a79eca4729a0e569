// Package wal is warren's write-ahead log: a segmented, append-only log of opaque records in a
// directory, with a checksum per batch, group commit, a sync policy, and recovery that truncates
// a torn tail and reports corruption. It knows nothing of messages: the broker's store encodes
// its records. docs/DURABILITY.md has the design.
package wal

package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
)

// The log's format on disk, version 2. Everything is little-endian.
//
// A segment is the file <16 hex digits>.wal, numbered from 1: a header, then batches.
//
// The header, headerSize bytes:
//
//	magic       "WARRENW2": the format's version (version 1, "WARRENW1", had no record numbers,
//	            start or seal, and is refused with ErrVersion)
//	seg         u64  the segment's number: a file renamed or copied into the wrong place is found
//	first       u64  the number of its first record: how many records the log held before it
//	start       u64  the log's start when the segment was created: the oldest segment it needs
//	startFirst  u64  the number of segment start's first record
//	prevSynced  u64  how many bytes of the segment before it were known durable when it was
//	                 created (0: none known)
//	crc         u32  CRC-32C of the bytes above
//	(4 zero bytes)
//
// A batch: length u32 | crc u32 | payload, length bytes long; crc is the CRC-32C of the payload
// seeded with the segment's number and the batch's offset, so that a stale batch left at the
// same place by an earlier life of the file, or a batch copied elsewhere, fails its check. The
// payload:
//
//	kind    u8       data, seal or start
//	behind  uvarint  the batch's offset minus the bytes of its segment known durable when it
//	                 was written (a sync covers everything before it): what recovery needs to
//	                 tell a torn write, which only unsynced bytes can suffer, from damage
//	index   uvarint  how many records of its segment come before it
//	body:   data:  records, each uvarint length | bytes
//	        seal:  nothing: the segment is complete, and the next one exists (see Log.rotate)
//	        start: uvarint start | uvarint startFirst: the log's start moved there (see
//	               Log.removeBeside)

const (
	headerSize = 56
	frameSize  = 8 // batch frame: length (4), checksum (4)
	magic      = "WARRENW2"
	magicV1    = "WARRENW1"
	suffix     = ".wal"

	batchData  byte = 0
	batchSeal  byte = 1
	batchStart byte = 2

	// metaMax is the most bytes a batch's kind, behind and index take.
	metaMax = 1 + 2*binary.MaxVarintLen64
	// reserve is the room a batch's buffer keeps before its body, for its frame and meta, which
	// are known only when it is written: frame puts them at its end, so the body never moves.
	reserve = frameSize + metaMax
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// header is a segment's header.
type header struct {
	seg        uint64
	first      uint64
	start      uint64
	startFirst uint64
	prevSynced int64
}

func (h header) encode() []byte {
	b := make([]byte, headerSize)
	copy(b, magic)
	binary.LittleEndian.PutUint64(b[8:], h.seg)
	binary.LittleEndian.PutUint64(b[16:], h.first)
	binary.LittleEndian.PutUint64(b[24:], h.start)
	binary.LittleEndian.PutUint64(b[32:], h.startFirst)
	binary.LittleEndian.PutUint64(b[40:], uint64(h.prevSynced))
	binary.LittleEndian.PutUint32(b[48:], crc32.Checksum(b[:48], castagnoli))
	return b
}

// parseHeader reads the header of segment seg from its data. It returns an error wrapping
// ErrVersion for a segment of format 1, and errBadHeader for anything else that is not a good
// header of seg.
func parseHeader(data []byte, seg uint64) (header, error) {
	if formatV1(data, seg) {
		return header{}, fmt.Errorf("wal: %s is in the log format 1 of an earlier version; this version reads format 2 only: %w", segmentName(seg), ErrVersion)
	}
	if len(data) < headerSize || string(data[:8]) != magic ||
		binary.LittleEndian.Uint32(data[48:]) != crc32.Checksum(data[:48], castagnoli) {
		return header{}, errBadHeader
	}
	h := header{
		seg:        binary.LittleEndian.Uint64(data[8:]),
		first:      binary.LittleEndian.Uint64(data[16:]),
		start:      binary.LittleEndian.Uint64(data[24:]),
		startFirst: binary.LittleEndian.Uint64(data[32:]),
		prevSynced: int64(binary.LittleEndian.Uint64(data[40:])),
	}
	if h.seg != seg || h.start > seg || h.prevSynced < 0 {
		return header{}, errBadHeader
	}
	return h, nil
}

// formatV1 reports whether data is a segment of format 1: its 16-byte header (magic, number),
// and nothing after it or a batch of format 1 (length | checksum | records). A torn header of
// format 2 can read "WARRENW1"; it is not followed by a batch whose checksum holds.
func formatV1(data []byte, seg uint64) bool {
	const v1Header = 16
	if len(data) < v1Header || string(data[:8]) != magicV1 || binary.LittleEndian.Uint64(data[8:]) != seg {
		return false
	}
	if len(data) == v1Header {
		return true
	}
	if len(data) < v1Header+frameSize {
		return false
	}
	n := int64(binary.LittleEndian.Uint32(data[v1Header:]))
	end := v1Header + frameSize + n
	return n > 0 && end <= int64(len(data)) &&
		checksum(seg, v1Header, data[v1Header+frameSize:end]) == binary.LittleEndian.Uint32(data[v1Header+4:])
}

// frame fills in the frame and meta of a batch whose body follows buf[:reserve], and returns the
// bytes to write: the batch at offset off of segment seg, of whose bytes synced are known
// durable, after index records of the segment.
func frame(buf []byte, kind byte, seg uint64, off, synced int64, index uint64) []byte {
	var m [metaMax]byte
	meta := append(m[:0], kind)
	meta = binary.AppendUvarint(meta, uint64(off-synced))
	meta = binary.AppendUvarint(meta, index)
	at := reserve - len(meta) - frameSize
	payload := buf[at+frameSize:]
	copy(payload, meta)
	binary.LittleEndian.PutUint32(buf[at:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[at+4:], checksum(seg, off, payload))
	return buf[at:]
}

// sealBatch and startBatch return the buffers of a seal and of a start batch, for frame.
func sealBatch() []byte { return make([]byte, reserve) }

func startBatch(start, startFirst uint64) []byte {
	b := make([]byte, reserve, reserve+2*binary.MaxVarintLen64)
	b = binary.AppendUvarint(b, start)
	return binary.AppendUvarint(b, startFirst)
}

// batch is a good batch read back.
type batch struct {
	kind   byte
	synced int64  // bytes of its segment known durable when it was written
	index  uint64 // records of its segment before it
	body   []byte // data: its records
	n      int    // data: how many records
	next   int64  // where the next batch starts
	// start batches: the log's start, and the number of its first record
	start, startFirst uint64
}

// batchAt checks the batch at off in a segment's data, and returns it if it is good (parseBatch).
func batchAt(data []byte, off int64, seg uint64) (batch, bool) {
	if off < 0 || off > int64(len(data)) {
		return batch{}, false
	}
	return parseBatch(data[off:], off, seg)
}

// batchSize returns the size of the batch whose frame starts p (at least frameSize bytes long),
// frame included, as its frame says: how many bytes parseBatch needs.
func batchSize(p []byte) int64 { return frameSize + int64(binary.LittleEndian.Uint32(p)) }

// parseBatch checks the batch that starts p, at offset off of segment seg (p may go on past
// it), and returns it if it is good: its checksum holds and its contents parse. A batch that
// passes its checksum and does not parse is not one the log wrote: it is as bad as one that
// fails it. Open reads batches with it from a whole segment in memory (batchAt), Scan from a
// window of the file.
func parseBatch(p []byte, off int64, seg uint64) (batch, bool) {
	if len(p) < frameSize {
		return batch{}, false
	}
	size := batchSize(p)
	if size < frameSize+3 || size > int64(len(p)) {
		return batch{}, false
	}
	payload := p[frameSize:size]
	if checksum(seg, off, payload) != binary.LittleEndian.Uint32(p[4:]) {
		return batch{}, false
	}
	b := batch{kind: payload[0], next: off + size}
	behind, k := binary.Uvarint(payload[1:])
	if k <= 0 || behind > uint64(off) {
		return batch{}, false
	}
	b.synced = off - int64(behind)
	var j int
	b.index, j = binary.Uvarint(payload[1+k:])
	if j <= 0 {
		return batch{}, false
	}
	body := payload[1+k+j:]
	switch b.kind {
	case batchData:
		for rest := body; len(rest) > 0; b.n++ {
			var ok bool
			if _, rest, ok = nextRecord(rest); !ok {
				return batch{}, false
			}
		}
		b.body = body
		return b, b.n > 0
	case batchSeal:
		return b, len(body) == 0
	case batchStart:
		var i, m int
		b.start, i = binary.Uvarint(body)
		if i > 0 {
			b.startFirst, m = binary.Uvarint(body[i:])
		}
		return b, i > 0 && m > 0 && i+m == len(body) && b.start > 0 && b.start <= seg
	}
	return batch{}, false
}

// checksum is the CRC-32C of a batch's payload, seeded with its segment and offset, so that a
// batch found elsewhere than where it was written fails its check.
func checksum(seg uint64, off int64, payload []byte) uint32 {
	var seed [16]byte
	binary.LittleEndian.PutUint64(seed[:8], seg)
	binary.LittleEndian.PutUint64(seed[8:], uint64(off))
	return crc32.Update(crc32Seed(&seed), castagnoli, payload)
}

// crc32Seed is the CRC-32C of a batch's seed, computed here byte by byte from the table so that
// the seed stays on the stack (crc32.Checksum would move it to the heap, once per batch).
func crc32Seed(seed *[16]byte) uint32 {
	crc := ^uint32(0)
	for _, b := range seed {
		crc = castagnoli[byte(crc)^b] ^ crc>>8
	}
	return ^crc
}

// nextRecord splits the first record off a batch's records.
func nextRecord(b []byte) (rec, rest []byte, ok bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	return b[k : k+int(n)], b[k+int(n):], true
}

// uvarintLen returns the length of x's uvarint encoding.
func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// segmentName is the file name of segment n.
func segmentName(n uint64) string { return fmt.Sprintf("%016x%s", n, suffix) }

// segmentNumber parses a segment's file name.
func segmentNumber(name string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, suffix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 64)
	return n, err == nil && n > 0
}

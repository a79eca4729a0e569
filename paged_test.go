package warren

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/google/btree"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPagerFailure: a chunk the pager cannot read (or reads back wrong) stays paged, with its
// error kept, and nothing spins on it: popMin hands out nothing past it, and an expiry due in it
// is tried again after pageRetry, not at once. Once the pager reads again, the messages come
// back in order and expire.
func TestPagerFailure(t *testing.T) {
	r := newReadySet(btree.NewFreeListG[entry](32), 1)
	disk := map[uint64]entry{}
	broken := errors.New("disk gone")
	var fail error
	r.paged.window = 1
	r.paged.read = func(rank uint8, c *chunk) ([]entry, error) {
		if fail != nil {
			return nil, fail
		}
		var ents []entry
		for seq := c.first; seq <= c.last; seq++ {
			if e, ok := disk[seq]; ok && c.holds(seq) {
				ents = append(ents, e)
			}
		}
		return ents, nil
	}
	const deadline = int64(time.Second)
	for seq := uint64(1); seq <= 3; seq++ {
		e := entry{seq: seq, env: coreEnv(int(seq), 8, 0), deadline: deadline * int64(seq)}
		if !r.pages(0) {
			r.push(e)
			continue
		}
		disk[seq] = e
		r.pageOut(e, pageLoc{seg: 1, lsn: seq})
	}
	require.Equal(t, 2, r.paged.n, "the two messages past the window are paged")

	e, ok := r.popMin()
	require.True(t, ok)
	assert.Equal(t, uint64(1), e.seq)

	fail = broken
	_, ok = r.popMin()
	assert.False(t, ok, "nothing past a chunk that cannot be read")
	assert.ErrorIs(t, r.paged.err, broken)
	assert.Equal(t, 2, r.len(), "the paged messages are still counted")

	assert.Empty(t, r.readDue(2*deadline))
	k, ok := r.paged.expiries.Min()
	require.True(t, ok)
	assert.Equal(t, later(2*deadline, pageRetry), k.deadline, "read again after pageRetry, not at once")

	// A read that brings back what is not the chunk's (a chunk that does not describe its
	// segment, as a damaged checkpoint whose checksum holds can make) failed too.
	fail = nil
	at := later(2*deadline, pageRetry)
	kept := maps.Clone(disk)
	clear(disk)
	assert.Empty(t, r.readDue(at))
	assert.ErrorIs(t, r.paged.err, ErrStorage)
	k, ok = r.paged.expiries.Min()
	require.True(t, ok)
	assert.Equal(t, later(at, pageRetry), k.deadline, "a misread too is read again after pageRetry")

	maps.Copy(disk, kept)
	due := r.readDue(later(at, pageRetry))
	require.Len(t, due, 2, "both messages are due by then")
	assert.Equal(t, []uint64{2, 3}, []uint64{due[0].seq, due[1].seq})
	assert.NoError(t, r.paged.err, "a read that succeeds clears the error")
	assert.Zero(t, r.paged.n)
	assert.Zero(t, r.len())
}

package amqp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// unacked behaves as a map from tag to delivery whose multiple settlements go in tag order:
// random adds, single takes (mostly the oldest, some from the middle, some unknown or taken
// already) and takes up to a tag, against such a model; and its slice stays bounded by the
// window, not by the number of deliveries.
func TestUnacked(t *testing.T) {
	var u unacked
	model := map[uint64]bool{} // tag -> limited
	var next uint64
	r := rand.New(rand.NewPCG(1, 2))
	check := func() {
		t.Helper()
		limited := 0
		for _, l := range model {
			if l {
				limited++
			}
		}
		require.Equal(t, len(model), u.live)
		require.Equal(t, limited, u.limited)
	}
	for step := range 20000 {
		switch op := r.IntN(10); {
		case op < 5 && len(model) < 50:
			next++
			limited := r.IntN(2) == 0
			u.add(next, warren.Delivery{DeliveryTag: next}, limited)
			model[next] = limited
		case op < 8:
			var tag uint64
			if r.IntN(4) == 0 || len(model) == 0 {
				tag = r.Uint64N(next + 2) // maybe unknown, maybe taken already
			} else {
				tags := sortedTags(model)
				tag = tags[0]
				if r.IntN(3) == 0 {
					tag = tags[r.IntN(len(tags))]
				}
			}
			d, ok := u.take(tag)
			_, want := model[tag]
			require.Equal(t, want, ok, "step %d: take(%d)", step, tag)
			if ok {
				require.Equal(t, tag, d.DeliveryTag)
				delete(model, tag)
			}
		default:
			tag := r.Uint64N(next + 1) // 0: every one
			ds, tags := u.takeUpTo(tag, nil, nil)
			var want []uint64
			for _, t := range sortedTags(model) {
				if tag == 0 || t <= tag {
					want = append(want, t)
					delete(model, t)
				}
			}
			require.Equal(t, want, tags, "step %d: takeUpTo(%d)", step, tag)
			for i, d := range ds {
				require.Equal(t, tags[i], d.DeliveryTag)
			}
		}
		check()
		require.LessOrEqual(t, cap(u.es), 256, "the slice is bounded by the window (50 here)")
	}

	// One delivery held while thousands after it settle one by one.
	u = unacked{}
	u.add(1, warren.Delivery{DeliveryTag: 1}, true)
	for tag := uint64(2); tag < 10000; tag++ {
		u.add(tag, warren.Delivery{DeliveryTag: tag}, true)
		_, ok := u.take(tag)
		require.True(t, ok)
	}
	require.LessOrEqual(t, cap(u.es), 256, "gone entries behind a held one are dropped")
	d, ok := u.take(1)
	require.True(t, ok)
	require.Equal(t, uint64(1), d.DeliveryTag)
	require.Zero(t, u.live)
}

func sortedTags(m map[uint64]bool) []uint64 {
	var tags []uint64
	for t := range m {
		tags = append(tags, t)
	}
	slices.Sort(tags)
	return tags
}

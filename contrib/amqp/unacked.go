package amqp

import (
	"sort"

	"github.com/warrenmq/warren"
)

// unacked is a channel's deliveries that the client has not settled, in delivery-tag order.
//
// A channel gives tags in increasing order and appends each delivery as it gives its tag, so
// the entries are sorted by tag; clients settle mostly the oldest, so settled entries leave
// from the front. One settled in the middle is marked gone and dropped when it reaches the
// front. The live ones are moved to the start of the slice when the front has moved past half
// of it, or when gone entries are most of it (one delivery held long while later ones settle),
// so that the slice does not grow with the number of deliveries, only with how many are
// outstanding at once. No allocation per delivery once the slice has grown to the
// channel's largest window. Guarded by its channel's mu.
type unacked struct {
	es      []unackedEntry // es[head:] are the entries, live or gone
	head    int
	live    int // entries not gone
	limited int // live entries that count toward the channel's global prefetch
}

type unackedEntry struct {
	tag     uint64
	d       warren.Delivery
	limited bool // a consumer's delivery, counted toward the channel's global prefetch
	gone    bool
}

// add appends the delivery with tag, which is higher than every tag added before.
func (u *unacked) add(tag uint64, d warren.Delivery, limited bool) {
	if n := len(u.es) - u.head; n >= 64 && n > 2*u.live {
		u.compact() // gone entries dominate: one delivery held long while later ones settle
	} else if u.head > 0 && u.head >= len(u.es)/2 {
		n := copy(u.es, u.es[u.head:])
		clear(u.es[n:]) // the deliveries' references
		u.es, u.head = u.es[:n], 0
	}
	u.es = append(u.es, unackedEntry{tag: tag, d: d, limited: limited})
	u.live++
	if limited {
		u.limited++
	}
}

// take removes the delivery with tag and returns it, if it is there.
func (u *unacked) take(tag uint64) (warren.Delivery, bool) {
	es := u.es[u.head:]
	i := 0
	if len(es) == 0 || es[0].tag != tag { // the oldest, most of the time
		i = sort.Search(len(es), func(i int) bool { return es[i].tag >= tag })
		if i == len(es) || es[i].tag != tag || es[i].gone {
			return warren.Delivery{}, false
		}
	} else if es[0].gone {
		return warren.Delivery{}, false
	}
	d := es[i].d
	u.remove(u.head + i)
	u.trim()
	return d, true
}

// takeUpTo removes every delivery with a tag up to tag (every one for 0) and appends them to
// into, in tag order, with their tags to tags.
func (u *unacked) takeUpTo(tag uint64, into []warren.Delivery, tags []uint64) ([]warren.Delivery, []uint64) {
	for i := u.head; i < len(u.es) && (tag == 0 || u.es[i].tag <= tag); i++ {
		if !u.es[i].gone {
			into, tags = append(into, u.es[i].d), append(tags, u.es[i].tag)
			u.remove(i)
		}
	}
	u.trim()
	return into, tags
}

// compact moves the live entries to the start of the slice, in order.
func (u *unacked) compact() {
	n := 0
	for _, e := range u.es[u.head:] {
		if !e.gone {
			u.es[n] = e
			n++
		}
	}
	clear(u.es[n:])
	u.es, u.head = u.es[:n], 0
}

// remove marks entry i gone.
func (u *unacked) remove(i int) {
	e := &u.es[i]
	e.gone, e.d = true, warren.Delivery{}
	u.live--
	if e.limited {
		u.limited--
	}
}

// trim drops the gone entries at the front.
func (u *unacked) trim() {
	for u.head < len(u.es) && u.es[u.head].gone {
		u.head++
	}
	if u.head == len(u.es) {
		u.es, u.head = u.es[:0], 0
	}
}

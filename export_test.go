package warren

// UnlimitedBuffer is the channel capacity of unlimited-prefetch consumers in this package's
// tests: small, so that it fills (unlimited.go).
const UnlimitedBuffer = 4

func init() { unlimitedBuffer = UnlimitedBuffer }

// LookForRoom does at once what the queue's timer does when its look for room in
// unlimited-prefetch consumers' channels is due (unlimited.go), whether one is due or not: for
// tests that let no time pass. A look that is not due would find nothing to do differently.
func (q *Queue) LookForRoom() {
	q.mu.Lock()
	if q.endErr == nil {
		q.roomDue = 0
		q.dispatchLocked()
	}
	q.commit()
}

// ReadMemTotal and ReadCgroupLimit read what the default memory budget is made of (memory.go).
var (
	ReadMemTotal    = readMemTotal
	ReadCgroupLimit = readCgroupLimit
)

// HeaderCosts returns what checkHeaders' walk and tableCost make of a table's memory: the two
// must agree, since a dead letter's or a replayed message's headers are counted by the one and
// a publish's by the other.
func HeaderCosts(t Table) (walked, estimated int) {
	walked, _ = checkHeaders(t, false)
	return walked, tableCost(t, 0)
}

// checkpointEveryOption makes a durable broker take a checkpoint every n segments.
type checkpointEveryOption int

func (o checkpointEveryOption) applyBroker(c *brokerConfig) { c.checkpointEvery = int(o) }

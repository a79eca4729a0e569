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

package wal

import (
	"errors"
	"fmt"
	"syscall"
	"time"
)

// Stalls. A write that fails for want of space stalls the log rather than failing it: nothing
// it wrote is in doubt (write(2) reports how much it wrote, and the torn part is cut off), so
// the log keeps the records it could not write, in order, and writes them when space comes
// back. A sync that fails is another matter (see ErrFailed).
//
// While stalled:
//   - pending holds the kept records first, then those appended since, in order;
//   - no waiter writes: the retrier does, after backoff (retryFirst, doubling to retryMax), and
//     nothing polls when nothing is stalled;
//   - waiters whose records were written before the stall are synced as usual; the others
//     wait for the retry (Wait, WaitWritten), or are told (Sync, the flusher);
//   - Err reports it, so that the log's user can refuse new work before it makes any.
//
// The first write that succeeds ends it: the waiters are woken, and what nobody waits for is
// flushed as usual. Closing ends it too: one last try, and then the log fails.

const (
	retryFirst = 10 * time.Millisecond // the first retry's delay after a write found no space
	retryMax   = time.Second           // the longest delay between retries
)

// noSpace reports whether err is a write's failure for want of space: ENOSPC, EDQUOT (a quota),
// or MemFS's ErrNoSpace. (On Windows a full disk is ERROR_DISK_FULL, not recognised here: it
// fails the log.)
func noSpace(err error) bool {
	return errors.Is(err, ErrNoSpace) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// stalls reports whether err, which stopped a writer's turn, stalls the log rather than failing
// it: a write's want of space, not a sync's (see ErrFailed).
func stalls(err error) bool {
	var se syncError
	return noSpace(err) && !errors.As(err, &se)
}

// syncError is the error of an fsync the writer ran (a rotation's): it fails the log whatever
// its cause, ENOSPC included, since the pages it could not write back may be gone.
type syncError struct{ err error }

func (e syncError) Error() string { return e.err.Error() }
func (e syncError) Unwrap() error { return e.err }

// stallLocked stalls the log after a write failed with err for want of space, and arms the
// retrier. The caller holds mu.
func (l *Log) stallLocked(err error) {
	l.stall = fmt.Errorf("%w: %w", ErrStalled, err)
	l.backoff = min(max(2*l.backoff, retryFirst), retryMax)
	l.arm(&l.retrier, l.backoff, (*Log).retryTick)
}

// Err returns why the log takes no new work: an error wrapping ErrStalled while it is
// stalled, its failure (ErrFailed) once it failed, ErrClosed after Close; nil when it writes
// normally. It takes no lock: a caller checks it before it makes work that would go into the
// log (a write that stalls just after the check keeps the records appended meanwhile, and
// writes them when it resumes).
func (l *Log) Err() error {
	if p := l.health.Load(); p != nil {
		return *p
	}
	return nil
}

// noteHealthLocked stores what Err returns, after err, closed or stall may have changed. The
// caller holds mu. It allocates only when there is something to report: every write calls it.
func (l *Log) noteHealthLocked() {
	err := l.err
	switch {
	case err != nil:
	case l.closed:
		err = ErrClosed
	default:
		err = l.stall
	}
	if err == nil {
		if l.health.Load() != nil {
			l.health.Store(nil)
		}
		return
	}
	if p := l.health.Load(); p == nil || *p != err {
		p = new(error) // here, not err's address: that would move err to the heap on every call
		*p = err
		l.health.Store(p)
	}
}

// notify tells Options.OnStall that the log stalled or resumed, if that changed since it last
// told it. It is called with no lock of the log held, after a write changed the state; calls
// are ordered by notifyMu and read the state under it, so that the last state is always the
// one told, whichever goroutine gets here first.
func (l *Log) notify() {
	l.notifyMu.Lock()
	defer l.notifyMu.Unlock()
	l.mu.Lock()
	stall := l.stall
	l.mu.Unlock()
	if (stall != nil) == l.told {
		return
	}
	l.told = stall != nil
	l.opts.OnStall(stall)
}

// Closing prepares the log for Close, so that nobody waits for space past it: a stall in
// progress gets one last try now, and from now on a write that finds no space fails the log
// instead of stalling it (its waiters return the failure). Close calls it; a user that must
// stop waiters before it can call Close (the broker, whose goroutines may wait for the log)
// calls it first.
func (l *Log) Closing() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closingLocked()
}

// closingLocked is Closing; the caller holds mu.
func (l *Log) closingLocked() {
	if l.closing {
		return
	}
	l.closing = true
	for l.writing {
		l.cond.Wait()
	}
	if l.stall != nil && l.err == nil && !l.closed {
		l.writeLocked() // succeeds, or fails the log
	}
}

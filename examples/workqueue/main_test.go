package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
)

// lockedBuffer is a bytes.Buffer safe for the example's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// TestWorkqueue runs the example in virtual time and checks what it tells a reader: the crashed
// worker's jobs come back redelivered, the failing job says it failed before it is tried again,
// the poison job is dead-lettered for its delivery limit (read with the typed Deaths), and the
// queue ends empty.
func TestWorkqueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out lockedBuffer
		if err := run(&out); err != nil {
			t.Fatal(err)
		}
		text := out.buf.String()
		for _, want := range []string{
			"received job-1 (redelivered, delivery count 1)",
			"job-5 failed: transient error (nacked: back to its place, to be tried again)",
			"received job-5 (redelivered, delivery count 1)",
			"handler panicked on job-7",
			`dead-lettered: job-7 from "jobs" (reason delivery_limit)`,
			"queue holds 0 ready, 0 unacked",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("output lacks %q:\n%s", want, text)
			}
		}
		if i, j := strings.Index(text, "job-5 failed"), strings.Index(text, "received job-5 (redelivered"); i > j {
			t.Errorf("job-5's failure is told after its retry:\n%s", text)
		}
	})
}

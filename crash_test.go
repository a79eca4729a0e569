package warren

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The kill -9 test: a child process runs a durable broker under a workload and is killed at a
// random moment; the parent reopens the log and checks that every message whose publish was
// confirmed and whose Ack did not return is there, in order, once. The child writes what was
// confirmed to a journal with one write(2) each, which a kill -9 cannot undo.

const (
	crashChildEnv = "WARREN_CRASH_CHILD" // the child's data directory; set only in the child
	crashLifeEnv  = "WARREN_CRASH_LIFE"  // which life of the broker the child is: its message numbers start at life·10⁹
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// crashChild publishes numbered persistent messages and acks or nacks some, until it is
// killed, journaling "P n" once the publish of n was confirmed and "A n" once its Ack returned.
func crashChild(dir string) {
	journal, err := os.OpenFile(filepath.Join(dir, "journal"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		panic(err)
	}
	// Numbers never repeat across lives: a publish the kill interrupted after it reached the
	// log and before the journal said so is in the queue, unconfirmed, and must not be
	// mistaken for a later one.
	life, err := strconv.Atoi(os.Getenv(crashLifeEnv))
	if err != nil {
		panic(err)
	}
	next := life * 1_000_000_000
	b, err := Open(filepath.Join(dir, "log"), WithSync(SyncNever))
	if err != nil {
		panic(err)
	}
	q, err := b.DeclareQueue("jobs", Durable())
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
	ctx := context.Background()
	for {
		for range 1 + rng.IntN(8) {
			if err := b.Publish(ctx, "", "jobs", Message{Body: []byte(strconv.Itoa(next)), Persistent: true}); err != nil {
				panic(err)
			}
			fmt.Fprintf(journal, "P %d\n", next)
			next++
		}
		for range rng.IntN(6) {
			d, err := q.Get(ctx)
			if errors.Is(err, ErrEmpty) {
				break
			}
			if err != nil {
				panic(err)
			}
			n, _ := strconv.Atoi(string(d.Message.Body))
			if rng.IntN(5) == 0 {
				if err := d.Nack(); err != nil {
					panic(err)
				}
				continue
			}
			if err := d.Ack(); err != nil {
				panic(err)
			}
			fmt.Fprintf(journal, "A %d\n", n)
		}
	}
}

type journalEntry struct {
	op byte
	n  int
}

// readJournal reads a child's journal; a line cut by the kill is ignored.
func readJournal(path string) []journalEntry {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var es []journalEntry
	s := bufio.NewScanner(f)
	for s.Scan() {
		op, num, ok := strings.Cut(s.Text(), " ")
		n, err := strconv.Atoi(num)
		if ok && err == nil && (op == "P" || op == "A") {
			es = append(es, journalEntry{op[0], n})
		}
	}
	return es
}

func TestKill9(t *testing.T) {
	kills := 3
	if s := os.Getenv("WARREN_KILLS"); s != "" {
		var err error
		kills, err = strconv.Atoi(s)
		require.NoError(t, err, "WARREN_KILLS")
	}
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	redelivered := 0
	for kill := range kills {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprint(crashLifeEnv, "=", kill))
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()

		confirmed, acked := map[int]bool{}, map[int]bool{}
		for _, e := range readJournal(filepath.Join(dir, "journal")) {
			if e.op == 'P' {
				confirmed[e.n] = true
			} else {
				acked[e.n] = true
			}
		}
		b, err := Open(filepath.Join(dir, "log"))
		require.NoError(t, err, "kill %d", kill)
		q, err := b.Queue("jobs")
		var got []int
		if err == nil {
			for m := range q.Browse() {
				n, err := strconv.Atoi(string(m.Body))
				require.NoError(t, err)
				got = append(got, n)
			}
		} else {
			require.ErrorIs(t, err, ErrNotFound)
			require.Empty(t, confirmed, "kill %d: confirmed messages and no queue", kill)
		}
		require.NoError(t, b.Close())
		require.True(t, slices.IsSorted(got), "kill %d: in order: %v", kill, got)
		require.Equal(t, len(got), len(slices.Compact(slices.Clone(got))), "kill %d: each once", kill)
		have := map[int]bool{}
		for _, n := range got {
			have[n] = true
			if acked[n] {
				redelivered++ // an ack the kill lost (within FlushDelay of the kill)
			}
		}
		for n := range confirmed {
			if !acked[n] {
				require.True(t, have[n], "kill %d: confirmed message %d, not acked, is lost", kill, n)
			}
		}
		t.Logf("kill %d: %d confirmed, %d acked, %d in the queue", kill, len(confirmed), len(acked), len(got))
	}
	t.Logf("%d kills; acked messages found again (acks lost within FlushDelay of a kill): %d", kills, redelivered)
}

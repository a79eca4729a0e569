package main

import (
	"bytes"
	"context"
	"errors"
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

// The child process of TestKilledAndRestarted: this test binary, run with childDir set, runs the
// example in that directory and kills itself after killAfterEnv e-mails.
const (
	childDir     = "DURABLE_EXAMPLE_DIR"
	killAfterEnv = "DURABLE_EXAMPLE_KILL_AFTER"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childDir); dir != "" {
		n, _ := strconv.Atoi(os.Getenv(killAfterEnv))
		kill := func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) }
		if err := run(context.Background(), os.Stdout, dir, 20*time.Millisecond, n, kill); err != nil {
			panic(err)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestKilledAndRestarted runs the example in a child process that is killed (SIGKILL) while
// sending the fourth e-mail, then again: every job is sent, the one interrupted is delivered
// again, and nothing else twice. (An acknowledgement or a delivery is written to the log within
// a millisecond, not waited for: each e-mail takes 20 ms here, so none is within that window of
// the kill.)
func TestKilledAndRestarted(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDir+"="+dir, killAfterEnv+"=3")
	out, err := cmd.Output()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "the child was killed: %v\n%s", err, out)
	require.Equal(t, syscall.SIGKILL, exit.Sys().(syscall.WaitStatus).Signal())
	require.Contains(t, string(out), "published 10 jobs")
	require.Contains(t, string(out), "killed while sending welcome e-mail to user 4")

	var second bytes.Buffer
	require.NoError(t, run(context.Background(), &second, dir, time.Millisecond, 0, nil))
	text := second.String()
	require.Contains(t, text, "7 jobs left", "three were sent and acknowledged before the kill")
	require.Contains(t, text, "sent welcome e-mail to user 4 (again: delivered 1 time(s) before, when the process stopped)")
	require.Contains(t, text, "7 e-mails sent in this run; 0 jobs left")

	var third bytes.Buffer
	require.NoError(t, run(context.Background(), &third, dir, time.Millisecond, 0, nil))
	require.Contains(t, third.String(), "every job was sent in an earlier run", "a run after the last says so")
	require.Contains(t, third.String(), "-reset")
	entries, err := os.ReadDir(filepath.Join(dir, "broker"))
	require.NoError(t, err)
	for _, e := range entries {
		require.NotEqual(t, "sent.log", e.Name(), "the broker's directory is the broker's alone")
	}

	data, err := os.ReadFile(filepath.Join(dir, "sent.log"))
	require.NoError(t, err)
	sent := strings.Fields(strings.ReplaceAll(string(data), "welcome e-mail to user ", ""))
	slices.Sort(sent)
	require.Equal(t, []string{"1", "10", "2", "3", "4", "5", "6", "7", "8", "9"}, sent, "each job sent once")
}

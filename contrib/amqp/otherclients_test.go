package amqp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
)

// Clients in other languages than amqp091-go's, each running a smoke test script of
// testdata/clients against a server of a fresh broker: the same plan in each (see smoke.py's
// doc), and the same summary expected of each, testdata/clients/expected.json, what RabbitMQ
// does.

// clientsEnv, set to 1 (CI sets it), makes a client that is not installed fail the test
// instead of skipping it: .ci/run installs both, and a missing one must never pass unseen.
const clientsEnv = "WARREN_AMQP_CLIENTS"

// otherClient is a client, how to find out whether it is installed (and its version), and how
// to run its script.
type otherClient struct {
	name    string
	install string                 // how to install it, for the skip or failure message
	version func() (string, error) // an error: not installed
	command []string               // the script with its interpreter, run in testdata/clients; the URL follows
}

// rabbitEnv, when set, is the URL of a RabbitMQ (CI starts one) that each script runs against
// too: what expected.json says is what RabbitMQ does.
const rabbitEnv = "WARREN_RABBITMQ_URL"

// Each client's smoke test passes against the server: confirms, manual acks, a nack with
// requeue seen redelivered, a reject dead-lettered with its x-death, basic.get's message count,
// a mandatory publish returned, and a clean close. With $WARREN_RABBITMQ_URL, it passes against
// that RabbitMQ too. The clients run one after the other: against one RabbitMQ, the scripts'
// queues are the same.
func TestOtherClients(t *testing.T) {
	clients := []otherClient{
		{
			name: "pika",
			// Debian's python3-pika is for Debian's Python, which need not be the python3 first on
			// PATH (a pyenv one here).
			install: "apt-get install python3-pika",
			version: func() (string, error) {
				out, err := exec.Command("/usr/bin/python3", "-c", "import pika; print(pika.__version__)").Output()
				if ee, ok := errors.AsType[*exec.ExitError](err); ok {
					// The traceback's last line: "ModuleNotFoundError: No module named 'pika'".
					lines := strings.Split(strings.TrimSpace(string(ee.Stderr)), "\n")
					err = fmt.Errorf("/usr/bin/python3: %s", lines[len(lines)-1])
				}
				return strings.TrimSpace(string(out)), err
			},
			command: []string{"/usr/bin/python3", "smoke.py"},
		},
		{
			name:    "amqplib",
			install: "node, and npm ci in testdata/clients/node",
			version: func() (string, error) {
				if _, err := exec.LookPath("node"); err != nil {
					return "", err
				}
				// amqplib's package.json is not among its exports: read the file.
				data, err := os.ReadFile(filepath.Join("testdata", "clients", "node", "node_modules", "amqplib", "package.json"))
				if err != nil {
					return "", err
				}
				var pkg struct{ Version string }
				err = json.Unmarshal(data, &pkg)
				return pkg.Version, err
			},
			command: []string{"node", "smoke.js"},
		},
	}

	want := map[string]any{}
	data, err := os.ReadFile(filepath.Join("testdata", "clients", "expected.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &want))

	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			version, err := c.version()
			if err != nil {
				if os.Getenv(clientsEnv) == "1" {
					t.Fatalf("%s is not installed (%v), and %s=1 says it must be: %s", c.name, err, clientsEnv, c.install)
				}
				t.Skipf("%s is not installed (%v): %s, or set %s=1 to fail instead", c.name, err, c.install, clientsEnv)
			}
			t.Run("warren", func(t *testing.T) {
				b := warren.New()
				defer b.Close()
				c.smoke(t, version, NewTestServer(t, b), want)

				// The broker agrees: the script deleted what it declared.
				for _, name := range []string{"smoke.work", "smoke.dlq"} {
					_, err := b.Queue(name)
					require.ErrorIs(t, err, warren.ErrNotFound, "Queue(%q)", name)
				}
				_, err := b.Exchange("smoke.dlx")
				require.ErrorIs(t, err, warren.ErrNotFound, "Exchange(%q)", "smoke.dlx")
			})
			t.Run("rabbitmq", func(t *testing.T) {
				url := os.Getenv(rabbitEnv)
				if url == "" {
					t.Skipf("%s is not set: the script does not run against RabbitMQ (CI sets it)", rabbitEnv)
				}
				c.smoke(t, version, url, want)
			})
		})
	}
}

// smoke runs c's script against the server at url and checks its summary: what the script
// checked itself, and want.
func (c otherClient) smoke(t *testing.T, version, url string, want map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.command[0], append(c.command[1:], url)...)
	cmd.Dir = filepath.Join("testdata", "clients")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s against %s: %s in %v", c.name, version, url, strings.Join(c.command, " "), time.Since(start).Round(time.Millisecond))
	require.NoError(t, err, "%s\nstdout: %s\nstderr: %s", cmd, &stdout, &stderr)

	var got map[string]any
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &got), "the summary on stdout: %s", &stdout)
	require.Equal(t, c.name, got["client"])
	require.Equal(t, version, got["version"], "the version the script reports")
	require.Empty(t, got["errors"], "the script's own checks")
	for key, value := range want {
		require.Equal(t, value, got[key], "summary[%q]", key)
	}
}

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenmq/warren"
)

// DurableDir is the directory in which the durable systems make their fresh directory for each
// run ("" is os.TempDir(): $TMPDIR, else /tmp). It must be on a real disk, not a tmpfs, or
// fsync costs nothing: FSType says what it is.
var DurableDir = ""

// WarrenSyncInterval is warren-durable-interval's SyncInterval. 100 ms is the library's
// default for SyncInterval(0) and the interval the log's own benchmark uses.
const WarrenSyncInterval = 100 * time.Millisecond

func init() {
	for _, d := range []struct {
		name   string
		policy warren.SyncPolicy
		what   string
	}{
		{"warren-durable-always", warren.SyncAlways, "`warren.WithSync(warren.SyncAlways)`, the default: every publish is fsynced before it is confirmed, concurrent publishers sharing an fsync (group commit)"},
		{"warren-durable-interval", warren.SyncInterval(WarrenSyncInterval), fmt.Sprintf("`warren.WithSync(warren.SyncInterval(%s))`: a publish is confirmed once written to the OS, and the log fsyncs at most %s after a write", WarrenSyncInterval, WarrenSyncInterval)},
		{"warren-durable-never", warren.SyncNever, "`warren.WithSync(warren.SyncNever)`: a publish is confirmed once written to the OS; fsync only when a segment is full and at Close"},
	} {
		register(Spec{
			Info: Info{
				Name: d.name, Ordered: true, Acks: true, Backlog: true, Durable: true, Batch: true,
				Setup: "`warren.Open(dir, opt)` with " + d.what + "; dir is a fresh directory made for the run with `os.MkdirTemp` (in `$TMPDIR`, else /tmp; removed after the run); queues declared `Durable()`, messages `Persistent: true`; otherwise as `warren`: W1 publishes with `Broker.PublishDeferred` through the default exchange, at most 4000 unconfirmed (the oldest `Confirmation.Wait`ed for before the next publish; the last one at the end), D1 and D3 with `Broker.Publish`, which returns once the message's record is written, and synced where the policy says, and D2 with `Broker.PublishBatch`; `Queue.Consume` with `Prefetch`, `Delivery.Ack` per message (an ack is logged, not waited for)",
			},
			Open: func() (System, error) { return newWarrenDurable(d.name, d.policy) },
		})
	}
}

func newWarrenDurable(name string, policy warren.SyncPolicy) (*warrenSys, error) {
	dir, err := os.MkdirTemp(DurableDir, "warren-bench-"+name+"-")
	if err != nil {
		return nil, err
	}
	b, err := warren.Open(dir, warren.WithSync(policy))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &warrenSys{b: b, durable: true, dir: dir, queues: map[string]*warren.Queue{}}, nil
}

// SyncProducer: warren's Publish returns once the message is confirmed.
func (s *warrenSys) SyncProducer() (Producer, error) {
	return &warrenProducer{b: s.b, persistent: s.durable}, nil
}

// DiskUsage is the bytes and number of the log's segment files.
func (s *warrenSys) DiskUsage() (int64, int, error) {
	if s.dir == "" {
		return 0, 0, nil
	}
	return WALUsage(s.dir)
}

// WALUsage is the total size and the number of warren's log segments (*.wal) in dir.
func WALUsage(dir string) (int64, int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	var bytes int64
	files := 0
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".wal") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			if os.IsNotExist(err) { // released between the listing and the stat
				continue
			}
			return 0, 0, err
		}
		bytes += info.Size()
		files++
	}
	return bytes, files, nil
}

// DirUsage is the total size of the regular files under dir and their number.
func DirUsage(dir string) (int64, int, error) {
	var bytes int64
	files := 0
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		bytes += info.Size()
		files++
		return nil
	})
	return bytes, files, err
}

#!/bin/sh
# backlog-100m.sh: a backlog of 100M messages, opened after a clean Close and after a kill -9,
# outside CI (about 10 minutes and 16 GB of disk a variant on a two-core machine). For each
# variant, one process fills a fresh log with N persistent 128-byte messages in one durable queue
# (PublishBatch of 256, SyncInterval(100ms)) and either closes the broker (clean) or is killed
# with SIGKILL after its last confirm (crash); then the page cache is dropped (root only; skipped
# otherwise, and said) and another process times Open until the queue's Len() is N and the first
# delivery, reads the RSS and the heap, drains the queue checking every message comes once and in
# order, and samples the peaks. Results: $OUT/fill-<variant>.json, open-<variant>.json,
# open-<variant>.time (GNU time's report of the open's process, its maximum RSS included).
#
# Usage: ./backlog-100m.sh [N] [variants...]   (defaults: 100000000 clean crash)
set -eu
N=${1:-100000000}
[ $# -gt 0 ] && shift
VARIANTS=${*:-clean crash}
OUT=${OUT:-results/backlog-checkpoint-100m}
BIN=$(mktemp -d)/bench
go build -o "$BIN" ./cmd/bench
mkdir -p "$OUT"
for v in $VARIANTS; do
	dir=$(mktemp -d "${TMPDIR:-/tmp}/warren-backlog-XXXX")
	fill="$OUT/fill-$v.json"
	rm -f "$fill"
	if [ "$v" = clean ]; then
		"$BIN" -child -recovery -step fill -step-dir "$dir" -sync interval -recovery-n "$N" -timeout 60m >"$fill"
	else
		"$BIN" -child -recovery -step fill -step-dir "$dir" -sync interval -recovery-n "$N" -timeout 60m -crash >"$fill" &
		pid=$!
		until grep -q '"ok"' "$fill" 2>/dev/null; do sleep 1; done
		kill -9 $pid
		wait $pid || true
	fi
	if [ "$(id -u)" = 0 ]; then
		sync
		echo 3 >/proc/sys/vm/drop_caches
	else
		echo "not root: the page cache is not dropped before the open" >&2
	fi
	/usr/bin/time -v "$BIN" -child -recovery -step open -step-dir "$dir" -sync interval -recovery-n "$N" -timeout 60m \
		>"$OUT/open-$v.json" 2>"$OUT/open-$v.time"
	rm -rf "$dir"
done

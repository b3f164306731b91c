#!/bin/bash
# Instructions the whole broker process spends on a bench.perf scenario, under callgrind:
#
#     bench/whole_process.sh TREE SCENARIO COUNT    # e.g. bench/whole_process.sh . txn_1 1000
#
# Starts TREE's `python -m minibroker` under `valgrind --tool=callgrind`, warms it up with 200 operations of
# SCENARIO (`python -m bench.perf_client`), zeroes the counters, drives COUNT operations (txn_1: transactions),
# dumps and stops the broker, and prints the instructions counted in between and per operation. Unlike
# bench.cost (engine and core in process) this counts trio, the connection task and the socket calls' user-space
# side; how many reads a request takes depends on timing, so repeated runs move by a few per cent.
set -euo pipefail
TREE=$(cd "$1" && pwd); SCENARIO=$2; COUNT=$3
PYTHON=$(python -c "import sys; print(sys.executable)")  # the interpreter itself, not a shim valgrind cannot follow
OUT=$(mktemp -d); PORT=$((20000 + RANDOM % 20000))
cd "$TREE"
PYTHONPATH=$TREE valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p" \
    "$PYTHON" -m minibroker --port $PORT --log-level warning > "$OUT/broker.log" 2>&1 &
BROKER=$!
trap 'kill -9 $BROKER 2>/dev/null || true; rm -rf "$OUT"' EXIT
for _ in $(seq 240); do grep -q listening "$OUT/broker.log" && break; sleep 0.5; done
grep -q listening "$OUT/broker.log" || { echo "the broker did not start: $(tail -3 "$OUT/broker.log")" >&2; exit 1; }
client() { PYTHONPATH=$TREE timeout 900 "$PYTHON" -m bench.perf_client "$SCENARIO" --url 127.0.0.1:$PORT \
    --address "bench.$1" --sync-address "bench.$1.sync" --count "$2" > "$OUT/client.$1" 2>&1; }
client warm 200
callgrind_control -z $BROKER > /dev/null 2>&1
client run "$COUNT"
callgrind_control -d $BROKER > /dev/null 2>&1
kill -INT $BROKER; timeout 60 tail --pid=$BROKER -f /dev/null || true
TOTAL=$(callgrind_annotate "$OUT"/cg.*.1 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
echo "$SCENARIO x $COUNT: $TOTAL instructions, $((TOTAL / COUNT)) per operation ($TREE)"

#!/usr/bin/env bash
# gap_switch.sh: issue 14's tail is the queued request: launched in the service's host gap after
# the previous one returns, it waits for the GPU to switch back from the training that ran in
# that gap (docs/design.md, node-level coordination). Session 24's linger kept nothing while the
# service's own timeslice (libcuda's, about 1 ms) still expired around each request's end. This
# runs `MODES=priority priority.py SECONDS` with the service waiting on its stream, in any of:
#   plain | linger (LINGER_US=300: a spin after each request on a side stream, its full length)
#   | linger_pre / linger_post (the same spin, ended by the next request moving a word of pinned
#   memory before / after its replay is queued: LINGER_END, needs CuPy) | long (the service's own
#   channel groups at 8 ms, bench/gpu/bin/tsg_probe.so) | both (linger and long)
# and prints each one's p99 ratio, queued p99 and the tail's `outside` (the switch), from
# $OUT/priority.jsonl. Session 26 (H200): linger takes the tail's `outside` to alone's, long adds
# nothing. The default runs plain, linger, linger_pre, linger_post: does a hook's linger, ended at
# the next launch, keep what the full-length one keeps, and only if it ends after the launch?
# hook / hook_off: the hook's own linger (LINGER_LIB: a build of the hook), on and off. Session 27
# (H200): its spin ungated kept nothing; through the gate it keeps what the service's own does.
# usage: DIST=... bench/gap_switch.sh [SECONDS] [VARIANTS...]   (needs nvcc or cc for tsg_probe.so;
#        SYNC=device|event: the service waits so instead of on its stream; a variant may end in
#        :VAR=VALUE[,VAR=VALUE...], more environment for both containers, e.g.
#        hook_off:VGPU_PRIORITY_IDLE_GRACE_US=1300 or plain:SYNC=device; STALL_PROBE=SECONDS: beside
#        each variant, bench/py/stall_probe.py times small writes to /tmp and /dev/shm files and a
#        plain syscall for SECONDS (waited for; ~130 covers a 30-s variant): a 100-ms request in
#        session 28 was not explained)
set -u
DIST=${DIST:-$(cd "$(dirname "$0")/.." && pwd)}
secs=${1:-40}
shift || true
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(plain linger linger_pre linger_post)
probe=$DIST/bench/gpu/bin/tsg_probe.so
if [ ! -f "$probe" ]; then
    mkdir -p "$(dirname "$probe")" && "${CC:-cc}" -shared -fPIC -O2 -o "$probe" "$DIST/bench/gpu/tsg_probe.c" -ldl -lpthread ||
        { echo "error=tsg_probe_build_failed"; exit 2; }
fi
out=${OUT:-$(mktemp -d /tmp/gap-switch-XXXXXX)}
for spec in "${variants[@]}"; do
    v=${spec%%:*}
    more=()
    [ "$v" != "$spec" ] && IFS=, read -r -a more <<<"${spec#*:}"
    case $v in
    plain) extra=() ;;
    linger) extra=(LINGER_US=300) ;;
    linger_pre) extra=(LINGER_US=300 LINGER_END=pre) ;;
    linger_post) extra=(LINGER_US=300 LINGER_END=post) ;;
    # The hook's own linger (branch `linger`): the build in $LINGER_LIB, lingering or not.
    hook) extra=(LIBVGPU="${LINGER_LIB:?hook needs LINGER_LIB}" LIBCUDA_LOG_LEVEL=3) ;;
    hook_off) extra=(LIBVGPU="${LINGER_LIB:?hook_off needs LINGER_LIB}" VGPU_PRIORITY_LINGER_US=0 LIBCUDA_LOG_LEVEL=3) ;;
    long) extra=(SERVICE_PRELOAD="$probe" TSG_TIMESLICE_US=8000) ;;
    both) extra=(LINGER_US=300 SERVICE_PRELOAD="$probe" TSG_TIMESLICE_US=8000) ;;
    *) echo "error=unknown_variant $v (plain linger linger_pre linger_post long both hook hook_off)"; exit 2 ;;
    esac
    # Each run its own folder (a variant may come twice).
    dir=$out/$(printf '%s' "$spec" | tr -c 'A-Za-z0-9_.-' '_')
    n=1
    while [ -e "$dir.$n" ]; do n=$((n + 1)); done
    dir=$dir.$n
    mkdir -p "$dir"
    probe_pid=
    if [ -n "${STALL_PROBE:-}" ]; then
        python3 "$DIST/bench/py/stall_probe.py" "$STALL_PROBE" /tmp /dev/shm >"$dir/stall_probe.txt" 2>&1 &
        probe_pid=$!
    fi
    env "${extra[@]}" OUT="$dir" DIST="$DIST" SYNC="${SYNC:-stream}" "${more[@]}" MODES=priority python3 "$DIST/bench/py/priority.py" "$secs" >"$dir/priority.txt" 2>&1
    if [ -n "$probe_pid" ]; then
        wait "$probe_pid"
        sed "s/^/gap_switch variant=$spec /" "$dir/stall_probe.txt"
    fi
    python3 - "$dir/priority.jsonl" "$spec" <<'PY'
import json, sys
try:
    r = json.loads(open(sys.argv[1]).readlines()[-1])
except (OSError, IndexError, ValueError):
    sys.exit(print(f"gap_switch variant={sys.argv[2]} error=no_result"))
a, p = r["service_alone"], r["priority"]["service"]
print(f"gap_switch variant={sys.argv[2]} p99_ratio={r['p99_ratio']} keeps={r['priority']['training_keeps']} "
      f"p99_ms={a['p99_ms']}->{p['p99_ms']} queued_lat_p99_ms={a.get('queued_lat_p99_ms')}->{p.get('queued_lat_p99_ms')} "
      f"outside_p50_ms={a.get('outside_p50_ms')}->{p.get('outside_p50_ms')} "
      f"tail_outside_ms={a.get('tail_outside_ms')}->{p.get('tail_outside_ms')} max_ms={a.get('max_ms')}->{p.get('max_ms')}", flush=True)
# The slowest request beside the training: where its time went, and when (the service's log has three).
for x in p.get("slowest", [])[:1]:
    print(f"gap_switch variant={sys.argv[2]} slowest " + " ".join(f"{k}={v}" for k, v in x.items()), flush=True)
PY
    # Whether the hook lingered: its first and every 1000th spin, from the service's log.
    case $v in hook | hook_off)
        echo "gap_switch variant=$spec service_lingers: $(grep -ho 'linger: [0-9]* spins' "$dir"/priority-service-*.log 2>/dev/null | tail -2 | tr '\n' ' ')"
        # With LIBCUDA_LOG_LEVEL=4: the longest single stretch of each part of the hook's own work.
        echo "gap_switch variant=$spec service_hook_longest: $(grep -h 'launch gate:' "$dir/priority-service-priority.log" 2>/dev/null | tail -1 | grep -o '[a-z_]*_max_us=[0-9]*' | tr '\n' ' ')" ;;
    esac
    # Whether the driver took the 8 ms: the timeslices tsg_probe read back from the service's groups.
    case $v in long | both)
        echo "gap_switch variant=$spec service_groups_read_back: $(grep -ho 'after_us=[0-9]*' "$dir"/priority-service-*.log 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ')" ;;
    esac
done

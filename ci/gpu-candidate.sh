#!/usr/bin/env bash
# gpu-candidate.sh: judge another build of the hook (a branch's libvgpu.so) against dist/libvgpu.so
# on a GPU, as sessions 18-21 learned to: GPT-2's speed at cap 99 moves 0.74-1.02 from round to
# round, so builds are compared only within a round, and a candidate lands only after parts 1 and 2.
#   compare [ROUNDS]  GPT-2 training at cap 99: each build once for 45 s with the gate's debug
#                     counters (steps/s, time held, queue waits), then bench/py/gate_cost.py's paired
#                     rounds (default 6, ~70 s each on an H100; each run printed as it ends)
#   part N            ci/gpu-acceptance.sh N with the candidate as libvgpu.so (a copy of dist/ in /tmp)
#   malloc [ROUNDS]   cuMemAlloc+cuMemFree 1 MiB under an 8g cap (samples/bench_malloc --slow-us 1000),
#                     no hook / dist's / the candidate, interleaved processes (default 15 rounds):
#                     each one's median ns, pairs over 1 ms a second and the share of its pairs' time
#                     spent in them (medians of rounds), the hooks' median per-round ratios to
#                     no hook, and per process its slow pairs and when the first one came
#                     (first_slow_s: one early stall a process is start-up, not a periodic call);
#                     MALLOC_RUNS=N: bench_malloc's --runs (default 11, ~1.4 s a process on an H200)
#   share ROUNDS SECTION...  ci/gpu-share.sh SECTION... with dist's build and the candidate in turn,
#                     ROUNDS rounds (a program's own readings move from run to run, so one run of
#                     each says little); per build and line: verdicts, utilization beside NVML's
#                     own samples' mean, throughput over its want
# usage: dist/ci/gpu-candidate.sh LIB compare [ROUNDS] | LIB part N | LIB malloc [ROUNDS] | LIB share ROUNDS SECTION...   ($OUT: logs)
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd)
lib=${1:-}
[ -n "$lib" ] && [ -f "$lib" ] || { sed -n '2,20p' "$0"; echo "error=no_candidate_library path=${lib:-<none>}" >&2; exit 2; }
[ -f "$DIST/libvgpu.so" ] || { echo "error=no_hook_library path=$DIST/libvgpu.so (run the copy in dist/, laid out by ci/package-gpu.sh)" >&2; exit 2; }
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
export DIST PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
case "${2:-}" in
compare)
    for l in "$DIST/libvgpu.so" "$lib"; do
        log=$out/candidate-debug-$(basename "$l").log
        LD_PRELOAD=$l LIBCUDA_LOG_LEVEL=4 CUDA_DEVICE_SM_LIMIT=99 CUDA_DEVICE_MEMORY_SHARED_CACHE=$(mktemp -u /tmp/cand-XXXXXX) \
            timeout 45 python3 "$DIST/bench/py/workloads.py" gpt2 >"$log" 2>&1
        # Steps/s from the first and last progress lines; the gate's last counters and meter line.
        rate=$(awk '/^progress /{split($2,t,"=");split($3,n,"="); if(!s){t0=t[2];n0=n[2];s=1} t1=t[2];n1=n[2]} END{if(t1>t0) printf "%.2f", (n1-n0)/(t1-t0); else print "nan"}' "$log")
        echo "candidate_debug lib=$(basename "$l") steps_per_s=$rate"
        grep "launch gate" "$log" | tail -1 | sed 's/^.*launch gate: /  gate: /' | cut -c1-300
        grep "meter dev" "$log" | tail -1 | sed 's/^.*meter dev/  meter dev/' | cut -c1-300
    done
    ALT=$lib MODES="cap99 alt_cap99" python3 "$DIST/bench/py/gate_cost.py" gpt2 6 "${3:-6}" ;;
malloc)
    tsv=$out/candidate-malloc.tsv
    : >"$tsv"
    for i in $(seq "${3:-15}"); do
        for which in off main cand; do
            case $which in
            off) pre=() ;;
            main) pre=(LD_PRELOAD="$DIST/libvgpu.so") ;;
            cand) pre=(LD_PRELOAD="$lib") ;;
            esac
            line=$(env -u LD_PRELOAD "${pre[@]}" CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_MEMORY_SHARED_CACHE="$(mktemp -u /tmp/cand-XXXXXX)" \
                "$DIST/samples/bench_malloc" --slow-us 1000 --runs "${MALLOC_RUNS:-11}" 2>&1 | tr '\n' ' ')
            ns=$(sed -n 's/.*malloc_free_ns=\([0-9.]*\) .*/\1/p' <<<"$line")
            slow=$(sed -n 's/.*slow_pairs_per_s=\([0-9.]*\).*/\1/p' <<<"$line")
            share=$(sed -n 's/.*slow_time_share=\([0-9.]*\).*/\1/p' <<<"$line")
            count=$(sed -n 's/.*slow_pairs=\([0-9]*\) .*/\1/p' <<<"$line")
            first=$(sed -n 's/.*first_slow_s=\([-0-9.]*\).*/\1/p' <<<"$line")
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$which" "$i" "$ns" "$slow" "$share" "$count" "$first" >>"$tsv"
        done
    done
    python3 - "$tsv" "$(basename "$lib")" <<'PY'
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    w, i, ns, slow, share, count, first = (line.rstrip("\n").split("\t") + [""] * 5)[:7]
    if ns and slow:
        v.setdefault(w, {})[i] = (float(ns), float(slow), float(share or "nan"), float(count or "nan"), float(first or "nan"))
for w, name in (("off", "no hook"), ("main", "dist's libvgpu.so"), ("cand", sys.argv[2])):
    if w not in v:
        print(f"candidate_malloc build={name} runs=0")
        continue
    ns = statistics.median(x[0] for x in v[w].values())
    slow = statistics.median(x[1] for x in v[w].values())
    share = statistics.median(x[2] for x in v[w].values())
    ratio = ""
    if w != "off" and "off" in v:
        r = [v[w][i][0] / v["off"][i][0] for i in v[w] if i in v["off"]]
        ratio = f" ratio={statistics.median(r):.3f} min={min(r):.3f} max={max(r):.3f}"
    print(f"candidate_malloc build={name} malloc_free_ns={ns:.0f} slow_pairs_per_s={slow:.2f} slow_time_share={share:.5f}{ratio} rounds={len(v[w])}")
    # Per process: its slow pairs, and when its first one came (-1: none).
    print(f"candidate_malloc build={name} slow_pairs_each=" + ",".join(f"{x[3]:.0f}" for x in v[w].values())
          + " first_slow_s_each=" + ",".join(f"{x[4]:.2f}" for x in v[w].values()))
PY
    ;;
share)
    rounds=${3:-}
    [[ "$rounds" =~ ^[1-9][0-9]*$ ]] && [ $# -ge 4 ] || { sed -n '2,20p' "$0"; echo "error=share_needs_rounds_and_sections" >&2; exit 2; }
    shift 3
    for i in $(seq "$rounds"); do
        for which in main cand; do
            dir=$out/candidate-share-$which-$i
            mkdir -p "$dir"
            [ $which = cand ] && l=$lib || l=$DIST/libvgpu.so
            echo "== round $i build=$which"
            OUT=$dir LIBVGPU=$l "$DIST/ci/gpu-share.sh" "$@" 2>&1 | grep -E " ok=" | sed -E 's/ (samples|nvml_n|nvml_ms|sm_mhz)=[^ ]*//g'
        done
    done
    python3 - "$out" "$rounds" "$(basename "$lib")" <<'PY'
import glob, json, os, sys
out, rounds, cand = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for which, name in (("main", "dist's libvgpu.so"), ("cand", cand)):
    lines = {}
    for i in range(1, rounds + 1):
        path = os.path.join(out, f"candidate-share-{which}-{i}", "share.jsonl")
        for row in (json.loads(l) for l in open(path)) if os.path.exists(path) else ():
            if row.get("cap") and "ok" in row:
                lines.setdefault((row["name"], row["cap"]), []).append(row)
    fails = sum(not r["ok"] for rs in lines.values() for r in rs)
    print(f"candidate_share build={name} rounds={rounds} lines={sum(map(len, lines.values()))} failed={fails}")
    for (prog, cap), rs in sorted(lines.items()):
        each = ", ".join(f"{r['util']:.1f}/{r.get('nvml_win', float('nan')):.1f} [{r['util_min']}..{r['util_max']}] {r['tput'] / r['want_tput']:.3f}{'' if r['ok'] else ' FAIL'}" for r in rs)
        print(f"  {prog} cap={cap}: util/samples [1-s] tput/want: {each}")
PY
    ;;
part)
    copy=$(mktemp -d /tmp/candidate-dist-XXXXXX)
    cp -r "$DIST/." "$copy/"
    cp "$lib" "$copy/libvgpu.so"
    echo "candidate $(basename "$lib") over $(cat "$DIST/COMMIT" 2>/dev/null || echo unknown)" >"$copy/COMMIT"
    "$copy/ci/gpu-acceptance.sh" "${3:-}"
    rc=$?
    rm -rf "$copy"
    exit $rc ;;
*) sed -n '2,20p' "$0"; exit 2 ;;
esac

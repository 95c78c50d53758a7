"""How long a window NVML's one-a-second reading covers (nvmlDeviceGetUtilizationRates).

The compute cap is judged by that reading, and how much budget the hook may save for a burst
(limiter::SAVE_MAX_NS) depends on it: a burst of B ms moves a reading that covers W ms by
100 * B / W points. Runs test_streams without the hook, one kernel of --pulse-ms every
--period-ms (the GPU idle between), polls the reading every 2 ms, and prints per pulse the
highest reading it caused and how long the reading stayed above zero; their medians give the
window (W = 100 * pulse / reading) and, beside them, NVML's own samples (nvmlDeviceGetSamples)
of the same pulses.
With a period that does not divide 200 ms (e.g. 1030) the pulses drift across NVML's refresh, and
the share of them the reading sees tells a window on a fixed grid (an H100, session 31: (100 +
pulse) / 200 of them, each read whole) from a sliding one (all of them).
usage: reading_window.py [--pulse-ms 20] [--period-ms 1000] [--seconds 12]   env DIST
"""
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import DIST, Nvml  # noqa: E402


def runs_above_zero(polls):
    """[(start, end, peak)] of each stretch of nonzero readings in [(t, value)]."""
    out, cur = [], None
    for t, v in polls:
        if v > 0 and cur is None:
            cur = [t, t, v]
        elif v > 0:
            cur[1], cur[2] = t, max(cur[2], v)
        elif cur is not None:
            out.append(tuple(cur))
            cur = None
    return out


def main():
    a = sys.argv[1:]
    o = dict(zip(a[::2], a[1::2]))
    pulse_ms = float(o.get("--pulse-ms", "20"))
    period_ms = float(o.get("--period-ms", "1000"))
    seconds = int(o.get("--seconds", "12"))
    nvml = Nvml()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    gap_us = (period_ms - pulse_ms) * 1000
    cmd = [f"{DIST}/samples/test_streams", "--us", str(pulse_ms * 1000), "--gap-us", str(gap_us),
           "--sync-every", "1", "--seconds", str(seconds)]
    polls, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            polls.append((time.monotonic(), nvml.util()))
            time.sleep(0.002)

    since_us = int(time.time() * 1e6)
    th = threading.Thread(target=poll)
    th.start()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    time.sleep(1.5)
    stop.set()
    th.join()
    samples = [v for _, v in nvml.samples_since(since_us)]
    stretches = runs_above_zero(polls)[1:]  # the first may have started before polling
    peaks = [s[2] for s in stretches]
    lasts = [1000 * (s[1] - s[0]) for s in stretches]
    change_at = [b[0] for a, b in zip(polls, polls[1:]) if a[1] != b[1]]
    spacing = [1000 * (b - a) for a, b in zip(change_at, change_at[1:])]
    if p.returncode != 0 or not peaks:
        print(f"reading_window: no pulses seen (test_streams rc={p.returncode}): {p.stderr.strip()[-300:]}")
        sys.exit(1)
    peak = statistics.median(peaks)
    nonzero = [s for s in samples if s > 0]
    # A window of W ms on a fixed 200-ms grid sees (W + pulse) / 200 of pulses whose phase drifts
    # across the grid (a period that does not divide 200 ms); a sliding one would see them all.
    sent = max(1, int(seconds * 1000 / period_ms) - 1)  # the first stretch is left out above
    print(f"pulse_ms={pulse_ms:g} period_ms={period_ms:g} pulses={len(peaks)} pulses_sent~{sent} "
          f"seen_share={len(peaks) / sent:.2f} fixed_100ms_grid_predicts={min(1.0, (100 + pulse_ms) / 200):.2f} reading_peaks={peaks} "
          f"reading_peak_median={peak} implied_window_ms={100 * pulse_ms / peak:.0f} "
          f"nonzero_for_ms_median={statistics.median(lasts):.0f} polls={len(polls)} "
          f"changes={len(change_at)} change_spacing_ms_min={min(spacing, default=0):.0f} samples_nonzero={nonzero}")


if __name__ == "__main__":
    main()

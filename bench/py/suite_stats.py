"""Numbers for ci/gpu-suite.sh, computed from the samples' key=value logs (no dependencies).

  suite_stats.py key LOG KEY                 last value of KEY in LOG (or "n/a")
  suite_stats.py ratio A B                   A / B with 3 decimals (or "n/a")
  suite_stats.py share BASE_LOG CAP_LOG CAP  compute share of a capped run:
      share = avg kernels/s capped / avg kernels/s uncapped, and per 1 s window
      (`second=K kernels_per_sec=X` lines) the window share; prints
      `share=S target=T err_pts=E win_min=A win_max=B win_mad_pts=M windows=N`
      (err_pts = (share - target) in points, win_mad_pts = mean |window share - target|).
"""
import re
import sys


def values(path, key):
    pat = re.compile(r"(?:^|\s)" + re.escape(key) + r"=([^\s]+)")
    found = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                found += pat.findall(line)
    except OSError:
        pass
    return found


def last_float(path, key):
    v = values(path, key)
    try:
        return float(v[-1]) if v else None
    except ValueError:
        return None


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "key" and len(argv) == 4:
        v = values(argv[2], argv[3])
        print(v[-1] if v else "n/a")
    elif cmd == "ratio" and len(argv) == 4:
        try:
            a, b = float(argv[2]), float(argv[3])
            print(f"{a / b:.3f}" if b else "n/a")
        except ValueError:
            print("n/a")
    elif cmd == "share" and len(argv) == 5:
        base = last_float(argv[2], "avg_kernels_per_sec")
        capped = last_float(argv[3], "avg_kernels_per_sec")
        target = float(argv[4]) / 100.0
        if not base or capped is None:
            print("share=n/a target=%.2f err_pts=n/a win_min=n/a win_max=n/a win_mad_pts=n/a "
                  "windows=0" % target)
            return 0
        # The key must follow the line start or a space, so avg_/min_/max_ lines do not count.
        wins = [float(x) / base for x in values(argv[3], "kernels_per_sec")]
        share = capped / base
        if wins:
            mad = sum(abs(w - target) for w in wins) / len(wins)
            print("share=%.3f target=%.2f err_pts=%+.1f win_min=%.3f win_max=%.3f "
                  "win_mad_pts=%.1f windows=%d" % (share, target, (share - target) * 100,
                                                  min(wins), max(wins), mad * 100, len(wins)))
        else:
            print("share=%.3f target=%.2f err_pts=%+.1f win_min=n/a win_max=n/a win_mad_pts=n/a "
                  "windows=0" % (share, target, (share - target) * 100))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

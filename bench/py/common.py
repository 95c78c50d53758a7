"""Shared helpers for the bench/py scripts: key=value output and per-second rate lines."""
import sys
import time


def out(**kv):
    """Print one line of key=value pairs (values without spaces) and flush."""
    parts = []
    for k, v in kv.items():
        s = f"{v:.3f}" if isinstance(v, float) else str(v)
        parts.append(f"{k}={s.replace(' ', '_')}")
    print(" ".join(parts), flush=True)


class Rate:
    """Counts units; prints `second=K <unit>_per_sec=X` each full second, totals at the end."""

    def __init__(self, unit):
        self.unit = unit
        self.start = self.win = time.monotonic()
        self.count = self.total = 0
        self.second = 0

    def add(self, n=1):
        now = time.monotonic()
        self.count += n
        self.total += n
        if now - self.win >= 1.0:
            self.second += 1
            out(second=self.second, **{f"{self.unit}_per_sec": self.count / (now - self.win)})
            self.win, self.count = now, 0
        return now - self.start

    def finish(self):
        el = time.monotonic() - self.start
        out(**{f"total_{self.unit}": self.total, "elapsed_s": el,
               f"avg_{self.unit}_per_sec": self.total / el if el > 0 else 0.0})


def fail(msg, code=1):
    out(error=msg)
    sys.exit(code)

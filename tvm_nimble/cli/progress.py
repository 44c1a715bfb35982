"""Progress display for long steps (compile, tune, bench): tqdm when on a terminal."""
from __future__ import annotations

import contextlib
import sys
import threading


@contextlib.contextmanager
def spinner(message: str):
    """Show ``message`` with elapsed seconds while the block runs (quiet when not a terminal)."""
    from tqdm import tqdm

    if not sys.stderr.isatty():
        print(f"{message} ...", file=sys.stderr)
        yield
        return
    bar = tqdm(total=None, desc=message, bar_format="{desc}: {elapsed}", file=sys.stderr)
    stop = threading.Event()

    def tick():
        while not stop.wait(0.5):
            bar.refresh()

    t = threading.Thread(target=tick, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        bar.close()

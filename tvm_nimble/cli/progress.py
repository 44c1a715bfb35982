"""Progress display for long steps (compile, tune, bench, train): tqdm (the spinner only on a terminal)."""
from __future__ import annotations

import contextlib
import sys
import threading


@contextlib.contextmanager
def spinner(message: str):
    """Show ``message`` with elapsed seconds while the block runs (quiet when not a terminal); yields the
    tqdm bar (None when not a terminal), whose text :func:`phase_listener` can change."""
    from tqdm import tqdm

    if not sys.stderr.isatty():
        print(f"{message} ...", file=sys.stderr)
        yield None
        return
    bar = tqdm(total=None, desc=message, bar_format="{desc}: {elapsed}", file=sys.stderr)
    stop = threading.Event()

    def tick():
        while not stop.wait(0.5):
            bar.refresh()

    t = threading.Thread(target=tick, daemon=True)
    t.start()
    try:
        yield bar
    finally:
        stop.set()
        t.join()
        bar.close()


def phase_listener(bar, message: str):
    """A listener for ``compiler.build.build_with``'s ``on_phase``: the spinner ``bar`` shows "message (phase)" while a
    build phase runs (nothing without a bar)."""
    def listen(phase: str) -> None:
        if bar is not None:
            bar.set_description_str(f"{message} ({phase})")  # set_description would add its own ": "

    return listen


def step_bar(total: int, desc: str, unit: str = "step"):
    """A tqdm bar over ``total`` steps, advanced with ``bar.update(1)`` and drawn at every update.

    tqdm's own ``for _ in tqdm(...)`` counts a step only when the next one begins and redraws at most
    every 0.1 s, so fast steps showed 0/N (with each new postfix) until the loop ended."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, mininterval=0, miniters=1, file=sys.stderr)

"""traceanalyzer.prefetch: pandas refused to one thread for a block, imported after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import traceanalyzer


def test_pandas_is_refused_only_to_the_blocks_thread_and_imported_after_it():
    # In a fresh process: pytest's own has imported pandas, which makes the block a no-op.
    script = """if True:
        import sys, threading
        from traceanalyzer import prefetch
        other = {}
        with prefetch.pandas_deferred():
            try:
                import pandas
                refused = False
            except ImportError:
                refused = True
            t = threading.Thread(target=lambda: other.update(pd=__import__("pandas.api.types")))
            t.start(); t.join()
        with prefetch.pandas_deferred():  # pandas is there now: nothing is refused
            import pandas.testing
        for t in threading.enumerate():
            if t.name == "traceanalyzer-pandas":
                t.join()
        print(refused, "pd" in other, any(isinstance(f, prefetch.RefusePandas) for f in sys.meta_path))
    """
    env = {**os.environ, "PYTHONPATH": str(Path(traceanalyzer.__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True", "False"]  # the finder is gone after the block

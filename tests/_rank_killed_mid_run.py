"""``vlm-eval`` whose rank 1 SIGKILLs itself before its batch number ``KILL_AFTER_BATCHES + 1``.

A kill at a chosen point rather than at a moment picked by a timer: the tiny test model
answers a query in milliseconds, faster than a watcher could aim a kill from outside.
The model itself runs unchanged; the launcher then stops the other rank, as it does
when any rank dies.
"""

import os
import signal
import sys

from evaluators.cli import main
from evaluators.model import HFModel

_answer = HFModel.__call__
_batches = 0


def _answer_then_die(self, queries):
    global _batches
    if os.environ.get("RANK") == "1":
        _batches += 1
        if _batches > int(os.environ["KILL_AFTER_BATCHES"]):
            os.kill(os.getpid(), signal.SIGKILL)
    return _answer(self, queries)


HFModel.__call__ = _answer_then_die

if __name__ == "__main__":
    sys.exit(main())

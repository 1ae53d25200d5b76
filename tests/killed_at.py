"""A CLI run SIGKILLed at a named point of its last steps.

    python -m tests.killed_at POINT -- ARGS...

runs ``python -m beam_pipeline ARGS`` and kills its whole process group with
SIGKILL (no clean-up at all, as a crash or the OOM killer would) the moment
it reaches POINT (:data:`POINTS`). Only the moment is chosen here; what is
on disk then is what the real run wrote.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from beam_pipeline.core import metadata
from beam_pipeline.storage import lock, output

# Point -> (object, attribute) whose call is the moment of the kill.
POINTS = {
    # imagerecords.json written, the temporary folder (the marker in it) not yet removed.
    "published": (output, "delete_temp_folder"),
    # The clean-up done (the marker gone), the lock in the temporary folder not yet given back.
    "cleaned": (lock.LocalLock, "release"),
}


def _kill(*args, **kwargs):
    os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> None:
    point, separator, *args = sys.argv[1:]
    assert separator == "--", sys.argv
    owner, name = POINTS[point]
    real = getattr(owner, name)

    def at_point(*a, **k):
        # delete_temp_folder also runs when a run gives up at once (resume.discard):
        # the point is the one after publishing only.
        out = args[args.index("--output") + 1]
        if os.path.exists(os.path.join(out, metadata.INFO_FILE)):
            _kill()
        return real(*a, **k)

    setattr(owner, name, at_point)
    sys.argv = ["beam_pipeline", *args]
    runpy.run_module("beam_pipeline", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

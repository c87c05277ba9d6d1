"""Run a module as ``python -m MODULE ARGS`` under cProfile, timing the main thread's CPU.

    python -m benchmarks.profile_process OUT.prof MODULE [ARGS...]

The profiler's clock is ``time.thread_time`` (CPU seconds of the main thread, not wall time: on
a loaded machine wall time mostly measures waiting). Other threads (gRPC's, the audit writer) are
not profiled. The statistics are written to OUT.prof whatever the module's exit; the exit code is
the module's.
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out, module, *rest = sys.argv[1:]
    sys.argv = [module, *rest]
    profile = cProfile.Profile(time.thread_time)
    code = 0
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    except SystemExit as leaving:
        code = leaving.code if isinstance(leaving.code, int) else (0 if leaving.code is None else 1)
    finally:
        profile.dump_stats(out)
    return code


if __name__ == "__main__":
    sys.exit(main())

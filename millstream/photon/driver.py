"""`python -m millstream.photon.driver SPEC.json`: one redundant Photon pipeline's driver process.

Runs `millstream.photon.pipeline.run_pipeline` on the spec (see PhotonPipelineSpec) until its logs are
finished. Exit codes: 0 finished; 1 the pipeline failed (one line on stderr, the details in its logs);
3 refused its owner name (one line on stderr): the verifier retired it (at start, or while running: the
registry refused a commit), or it belongs to another root.

A fault `die_after_commit` or `die_when` in the spec kills this driver's process group (driver and JVM) and the
Spark worker's own: start the driver in a process group of its own (`start_new_session=True`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback

from millstream.photon.liveness import OwnerRetired
from millstream.photon.ownership import OwnerOfAnotherRoot
from millstream.photon.pipeline import PhotonPipelineSpec, run_pipeline

EXIT_FAILED = 1
EXIT_REFUSED = 3
EXIT_RETIRED = EXIT_REFUSED  # the name it had when retirement was the only refusal


def stopped_by_retirement(error: BaseException) -> bool:
    """Whether a run failed because the registry refused a retired owner's commit. The step's failure
    wraps OwnerRetired (as a cause, or only as text when it crossed Spark's JVM), so both are checked.

    >>> stopped_by_retirement(RuntimeError("...millstream.photon.registry.OwnerRetired: pipeline owner 'a'..."))
    True
    """
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and not any(current is earlier for earlier in seen):
        if isinstance(current, OwnerRetired) or f"{OwnerRetired.__module__}.{OwnerRetired.__name__}" in str(current):
            return True
        seen.append(current)
        current = current.__cause__ or current.__context__
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m millstream.photon.driver", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="the pipeline's spec (JSON)")
    parser.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    args = parser.parse_args(argv)
    spec = PhotonPipelineSpec.load(args.spec)
    if spec.faults.dies and spec.faults.kill_process_group is None:
        spec = dataclasses.replace(spec, faults=dataclasses.replace(spec.faults, kill_process_group=os.getpgrp()))
    try:
        run_pipeline(spec, timeout_s=args.timeout)
    except (OwnerRetired, OwnerOfAnotherRoot) as refused:
        print(f"photon driver {spec.owner}: {refused}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if stopped_by_retirement(error):  # fenced while running: the registry refused a commit
            traceback.print_exc()
            print(f"photon driver {spec.owner}: the verifier retired this owner while it ran; the registry "
                  "refused its commits (start it under a new owner name with a new root)", file=sys.stderr)
            return EXIT_RETIRED
        traceback.print_exc()  # the driver's stderr is its log; the last line says it in one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"photon driver {spec.owner}: failed: {first}", file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())

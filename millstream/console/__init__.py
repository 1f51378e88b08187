"""What every millstream command shares: options checked before anything is touched
(`options`), the live progress display (`progress`) and running a pipeline with one-line failures
(`running`). Used by the demos (`python -m millstream.apps.zeitgeist`, `... .dips`) and by the
`millstream` command."""

from millstream.console.options import OneLineArgumentParser, UsageError, check_master, check_writable_directory
from millstream.console.progress import ComputationStatus, ProgressDisplay, Snapshot
from millstream.console.running import RunFailed, run_command, run_on_harness, run_on_spark

__all__ = [
    "ComputationStatus", "OneLineArgumentParser", "ProgressDisplay", "RunFailed", "Snapshot", "UsageError",
    "check_master", "check_writable_directory", "run_command", "run_on_harness", "run_on_spark",
]

"""A command's data directory: what --fresh may delete, and the settings a resumed run must keep.

A command that generates its input (the demos) stores the settings that define it in a JSON file
in its directory; running again with other settings would mix two inputs in one checkpoint, so it
is refused with one line saying how to resume, start over or use another directory.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any, Mapping, Sequence

from millstream.console.options import UsageError


def check_fresh_start(directory: str, marker: str | tuple[str, ...], what: str) -> None:
    """Refuse --fresh on a directory this command did not make: one that is not empty and holds
    none of `marker`. --fresh must never delete a user's unrelated files.

    >>> import tempfile, pathlib; base = pathlib.Path(tempfile.mkdtemp())
    >>> (base / "notes.txt").write_text("mine")
    4
    >>> check_fresh_start(str(base), "config.json", "a Zeitgeist data dir")
    Traceback (most recent call last):
    ...
    millstream.console.options.UsageError: --fresh would delete ..., which is not a Zeitgeist data dir (no config.json in it); delete it yourself or pick another directory
    """
    markers = (marker,) if isinstance(marker, str) else marker
    here, target = os.path.realpath(os.getcwd()), os.path.realpath(directory)
    where = ("is the current directory" if target == here else
             "holds the current directory" if os.path.commonpath([here, target]) == target else
             "is your home directory" if target == os.path.realpath(os.path.expanduser("~")) else None)
    if where is not None:  # a run there would have written among the user's own files
        raise UsageError(f"--fresh would delete {directory}, which {where}; give the run a directory of its own")
    if (os.path.isdir(directory) and os.listdir(directory)
            and not any(os.path.exists(os.path.join(directory, m)) for m in markers)):
        raise UsageError(f"--fresh would delete {directory}, which is not {what} (no {' or '.join(markers)} in it); "
                         "delete it yourself or pick another directory")


def delete_for_fresh_start(directory: str, marker: str | tuple[str, ...], what: str) -> None:
    """Delete `directory` for --fresh, after check_fresh_start."""
    check_fresh_start(directory, marker, what)
    if os.path.exists(directory):
        shutil.rmtree(directory)


def _flag(name: str, value: Any) -> str:
    shown = f"{value:g}" if isinstance(value, float) else f"{value}"
    return f"--{name.replace('_', '-')} {shown}"


def settings_for_run(directory: str, filename: str, section: str, asked: Mapping[str, Any],
                     defaults: Mapping[str, Any], what: str, options: Sequence[str] | None = None
                     ) -> tuple[dict[str, Any], bool]:
    """The settings of the run in `directory`: the stored ones when resuming (refusing options that
    differ from them), else `defaults` updated with `asked`, stored for the next run. Returns
    (settings, resumed). `what` names the kind of directory in messages; `options` the settings
    that are command-line options (default: all), which messages show as flags.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> settings_for_run(d, "run.json", "traffic", {"events": 5}, {"events": 9, "keys": 2}, "a dips root")
    ({'events': 5, 'keys': 2}, False)
    >>> settings_for_run(d, "run.json", "traffic", {}, {"events": 9, "keys": 2}, "a dips root")
    ({'events': 5, 'keys': 2}, True)
    >>> settings_for_run(d, "run.json", "traffic", {"keys": 3}, {"events": 9, "keys": 2}, "a dips root")
    Traceback (most recent call last):
    ...
    millstream.console.options.UsageError: ... holds a run made with --events 5 --keys 2, but this command asks for --keys 3; run without them to resume it, add --fresh to start over, or pick another directory
    """
    path = os.path.join(directory, filename)
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as stored_file:
                stored = dict(json.load(stored_file)[section])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UsageError(f"{path} is unreadable ({error}); add --fresh to start over") from None
        different = {name: value for name, value in asked.items() if stored.get(name) != value}
        if different:
            shown = " ".join(_flag(name, stored[name]) for name in (options or defaults) if name in stored)
            raise UsageError(f"{directory} holds a run made with {shown}, but this command asks for "
                             + ", ".join(_flag(k, v) for k, v in different.items())
                             + "; run without them to resume it, add --fresh to start over, or pick another directory")
        return stored, True
    if os.path.isdir(directory) and os.listdir(directory):
        raise UsageError(f"{directory} is not empty and holds no {filename}: it is not {what}; pick another directory")
    settings = {**defaults, **asked}
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump({section: settings, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}, out, indent=1)
    os.replace(tmp, path)
    return settings, False

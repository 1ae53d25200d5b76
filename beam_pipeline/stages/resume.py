"""A job's own leftovers in --output: recognised, so that the same command carries on.

The marker ``OUTPUT/.imagerecords-tmp/job.json`` holds the settings that decide the
records; what a rerun does with each kind of output folder: docs/scale.md, "Resume".
"""

from __future__ import annotations

import dataclasses
import json
import os

from beam_pipeline.core import metadata, spill
from beam_pipeline.core import settings as declared
from beam_pipeline.core.errors import UsageError
from beam_pipeline.stages.job_config import JobConfig
from beam_pipeline.storage import listing, paths
from beam_pipeline.storage import output as output_files

MARKER = output_files.MARKER


def key(config: JobConfig) -> dict:
    """What decides each record's bytes, split and label: a change means no reuse.

    Derived from the declarations on JobConfig and ImageSpec (settings.py),
    with the spill files' format. The shard target, --min_shards,
    --max_reject_fraction and --dedupe are not in it: they act on the records
    once they are made, so a rerun with a new shard size reuses the records of
    an interrupted run. --image_timeout_s is, as a limit a rerun may raise
    (:func:`conflict`).
    """
    return {"spill_format": spill.FORMAT, **declared.resume_key(config)}


def conflict(old: dict, new: dict) -> str:
    """Why a run with settings ``new`` cannot resume one with ``old``; "" when it can."""
    if old.get("spill_format") != new.get("spill_format"):
        return (
            f"spill_format {old.get('spill_format')} -> {new.get('spill_format')}: "
            "written by another version of imagerecords"
        )
    return declared.resume_conflict(old, new, JobConfig)


@dataclasses.dataclass(frozen=True)
class Leftovers:
    """What an output folder holds before a run."""

    kind: str  # "empty" | "finished" | "unfinished" | "foreign"
    ours: tuple[str, ...] = ()  # paths (relative) of the job's own files
    others: tuple[str, ...] = ()  # paths of files the job did not write
    settings: dict | None = None  # of the unfinished run


def _relative_files(output: str) -> list[str]:
    if paths.is_local(output):
        found = []
        for dirpath, _, files in os.walk(output):
            for name in files:
                found.append(os.path.relpath(os.path.join(dirpath, name), output))
        return [name.replace(os.sep, "/") for name in found]
    return [path[len(output) :].lstrip("/") for path in listing.files_under(output)]


def _read(path: str) -> bytes | None:
    try:
        if paths.is_local(path):
            with open(path, "rb") as stream:
                return stream.read()
        with paths.filesystems().open(path) as stream:
            return stream.read()
    except (OSError, FileNotFoundError):
        return None
    except Exception:  # a remote filesystem's own "not found"
        return None


def inspect(output: str) -> Leftovers:
    """Classifies what ``output`` holds (see the module docstring)."""
    # A live run's lock is its own business (lock.py), not a leftover.
    names = [n for n in _relative_files(output) if n != output_files.LOCK]
    if not names:
        return Leftovers("empty")
    ours = tuple(n for n in names if output_files.is_ours(n))
    others = tuple(n for n in names if n not in set(ours))
    # A finished dataset: imagerecords.json, or a format_version 1 one's
    # imagerecords.json (in version 2 TFDS's file, written just before ours).
    if metadata.INFO_FILE in names or (metadata.V1_INFO_FILE in names and MARKER not in names):
        return Leftovers("finished", ours, others)
    if MARKER not in names:
        if ours and all(n.startswith(metadata.TMP_DIR + "/") for n in ours) and not others:
            return Leftovers("unfinished", ours, others, None)  # killed before the marker
        return Leftovers("foreign", ours, others)
    data = _read(paths.join(output, MARKER))
    try:
        recorded = json.loads(data) if data else None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        recorded = None  # unreadable: the run starts over
    return Leftovers("unfinished", ours, others, recorded)


def _spill_is_for(spill_dir: str, settings: dict) -> bool:
    data = _read(os.path.join(spill_dir, spill.SETTINGS_FILE))
    try:
        return data is not None and not conflict(json.loads(data), settings)
    except (ValueError, AttributeError):  # not JSON, or not a JSON object
        return False


def check(output: str, overwrite: bool) -> Leftovers:
    """Refuses a finished dataset or others' files without ``overwrite``. Reads only."""
    found = inspect(output)
    if found.kind in ("finished", "foreign") and not overwrite:
        raise UsageError(
            f"--output {output} is not empty; pass --overwrite to replace an earlier run"
        )
    return found


def prepare(output: str, settings: dict, overwrite: bool, spill_dir: str | None) -> Leftovers:
    """Makes ``output`` ready for a run with ``settings``; returns what it found.

    Clears an earlier run's files with ``overwrite``; resumes an unfinished
    run of the same settings (deleting its stale final files and temp shards,
    keeping its spill files); refuses anything else with a UsageError.
    """
    found = check(output, overwrite)
    change = conflict(found.settings, settings) if found.settings is not None else ""
    if found.kind == "unfinished" and change and not overwrite:
        raise UsageError(
            f"--output {output} holds an unfinished run with other settings ({change}); "
            "run its command again to resume it, or pass --overwrite to start afresh"
        )
    if overwrite or found.kind != "unfinished" or found.settings is None:
        # First: the folder stops claiming to be complete.
        claims = [n for n in (metadata.INFO_FILE, metadata.V1_INFO_FILE) if n in found.ours]
        output_files.delete_ours(output, claims)
        output_files.delete_ours(output, [n for n in found.ours if n not in claims])
        output_files.delete_local_folder(spill_dir)  # a spill folder is only ever the job's own
    else:
        # Resuming: keep the spill files (and the marker); the rest is rewritten.
        spill_prefix = f"{metadata.TMP_DIR}/spill/"
        stale = [n for n in found.ours if n != MARKER and not n.startswith(spill_prefix)]
        output_files.delete_ours(output, stale)
        if spill_dir and not _spill_is_for(spill_dir, settings):
            output_files.delete_local_folder(spill_dir)  # a gs:// output's spill of another run
    if paths.is_local(output):
        output_files.remove_empty_folders(os.path.join(output, metadata.TMP_DIR))
    data = json.dumps(settings, indent=1, sort_keys=True).encode()
    output_files.write_atomically(paths.join(output, MARKER), data)
    if spill_dir:
        data = json.dumps(settings, sort_keys=True).encode()
        output_files.write_atomically(os.path.join(spill_dir, spill.SETTINGS_FILE), data)
    return found


def discard(output: str, spill_dir: str | None) -> None:
    """Removes what :func:`prepare` and a run that stopped at once left in a new output."""
    output_files.delete_local_folder(spill_dir)
    output_files.delete_temp_folder(output)
    if paths.is_local(output):
        try:
            os.rmdir(output)  # only if empty: it held nothing before this run
        except OSError:
            pass

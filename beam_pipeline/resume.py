"""A job's own leftovers in --output: recognised, so that the same command carries on.

At start the CLI writes a marker, ``OUTPUT/.imagerecords-tmp/job.json``,
holding the settings that decide the records' bytes, split and label (seed,
image settings, splits, input, classes). The marker is the last file a
successful run deletes, after ``dataset_info.json`` is written. So an
output folder is one of:

* empty: a new run;
* finished (``dataset_info.json``): replacing it needs ``--overwrite``;
* unfinished (the marker, no ``dataset_info.json``): a run that failed or was
  killed. With the same settings, the rerun resumes it: the records in its
  spill files are used, not converted again; with other settings it is
  refused (``--overwrite`` starts afresh), so records of two configurations
  never mix;
* anything else: refused without ``--overwrite``, as it holds files this
  job did not write.

Only files that match the job's own names are ever deleted (see
:data:`output.OURS`); other files in --output are left alone.
"""

from __future__ import annotations

import dataclasses
import json
import os

from beam_pipeline import listing, metadata, spill
from beam_pipeline import output as output_files
from beam_pipeline.errors import UsageError

MARKER = output_files.MARKER
SPILL_FORMAT = 2  # 2: records carry their source's sha256 (duplicates)


def settings(args, layout) -> dict:
    """What decides each record's bytes, split and label: a change means no reuse.

    The shard target, --min_shards and --max_reject_fraction are not in it:
    they only decide how the same records are cut into shards, so a rerun
    with a new shard size reuses the records of an interrupted run.
    """
    spec = args.image_spec
    return {
        "spill_format": SPILL_FORMAT,
        "input": layout.manifest or layout.root,
        "layout": layout.kind,
        "classes": list(layout.classes),
        "seed": args.seed,
        "splits": None if layout.kind == "presplit" else args.split_fractions,
        "resize": spec.resize,
        "image_size": spec.size,
        "upscale": spec.upscale,
        "jpeg_quality": spec.jpeg_quality,
    }


@dataclasses.dataclass(frozen=True)
class Leftovers:
    """What an output folder holds before a run."""

    kind: str  # "empty" | "finished" | "unfinished" | "foreign"
    ours: tuple[str, ...] = ()  # paths (relative) of the job's own files
    others: tuple[str, ...] = ()  # paths of files the job did not write
    settings: dict | None = None  # of the unfinished run


def _relative_files(output: str) -> list[str]:
    if listing.is_local(output):
        found = []
        for dirpath, _, files in os.walk(output):
            for name in files:
                found.append(os.path.relpath(os.path.join(dirpath, name), output))
        return [name.replace(os.sep, "/") for name in found]
    return [path[len(output) :].lstrip("/") for path in listing.files_under(output)]


def _read(path: str) -> bytes | None:
    try:
        if listing.is_local(path):
            with open(path, "rb") as stream:
                return stream.read()
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path) as stream:
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
    if metadata.INFO_FILE in names:
        return Leftovers("finished", ours, others)
    if MARKER not in names:
        if ours and all(n.startswith(metadata.TMP_DIR + "/") for n in ours) and not others:
            return Leftovers("unfinished", ours, others, None)  # killed before the marker
        return Leftovers("foreign", ours, others)
    data = _read(listing.join(output, MARKER))
    try:
        recorded = json.loads(data) if data else None
    except ValueError:
        recorded = None
    return Leftovers("unfinished", ours, others, recorded)


def _spill_is_for(spill_dir: str, settings: dict) -> bool:
    data = _read(os.path.join(spill_dir, spill.SETTINGS_FILE))
    try:
        return data is not None and json.loads(data) == settings
    except ValueError:
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
    if found.kind == "unfinished" and found.settings not in (None, settings) and not overwrite:
        change = spill.describe_change(found.settings, settings)
        raise UsageError(
            f"--output {output} holds an unfinished run with other settings ({change}); "
            "run its command again to resume it, or pass --overwrite to start afresh"
        )
    if overwrite or found.kind != "unfinished" or found.settings is None:
        if metadata.INFO_FILE in found.ours:  # first: the folder stops claiming to be complete
            output_files.delete_ours(output, [metadata.INFO_FILE])
        output_files.delete_ours(output, [n for n in found.ours if n != metadata.INFO_FILE])
        output_files.delete_local_folder(spill_dir)  # a spill folder is only ever the job's own
    else:
        # Resuming: keep the spill files (and the marker); the rest is rewritten.
        spill_prefix = f"{metadata.TMP_DIR}/spill/"
        stale = [n for n in found.ours if n != MARKER and not n.startswith(spill_prefix)]
        output_files.delete_ours(output, stale)
        if spill_dir and not _spill_is_for(spill_dir, settings):
            output_files.delete_local_folder(spill_dir)  # a gs:// output's spill of another run
    if listing.is_local(output):
        output_files.remove_empty_folders(os.path.join(output, metadata.TMP_DIR))
    data = json.dumps(settings, indent=1, sort_keys=True).encode()
    output_files.write_atomically(listing.join(output, MARKER), data)
    if spill_dir:
        data = json.dumps(settings, sort_keys=True).encode()
        output_files.write_atomically(os.path.join(spill_dir, spill.SETTINGS_FILE), data)
    return found


def discard(output: str, spill_dir: str | None) -> None:
    """Removes what :func:`prepare` and a run that stopped at once left in a new output."""
    output_files.delete_local_folder(spill_dir)
    output_files.delete_temp_folder(output)
    if listing.is_local(output):
        try:
            os.rmdir(output)  # only if empty: it held nothing before this run
        except OSError:
            pass

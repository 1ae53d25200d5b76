"""Exact dedupe as the engines wire it: the local step and the ``duplicates`` block."""

from __future__ import annotations

from beam_pipeline.core import counters
from beam_pipeline.features.dedupe import duplicates, stage
from beam_pipeline.stages.hooks import Block, LocalStep

NAME = "dedupe"


def run_local(config, batches, counted):
    """The groups of identical sources; under --dedupe, the batches without the copies."""
    groups = stage.find_groups(batches)
    if not (config.dedupe and groups):
        return batches, [], groups
    batches, copies = stage.drop_all_copies(batches, groups)
    counted[counters.DROPPED_AS_DUPLICATES] += len(copies)
    return batches, copies, groups


def blocks(config, results) -> list[Block]:
    """The ``duplicates`` block and duplicates.jsonl (written with or without --dedupe)."""
    groups = list(results[NAME])
    members = [members for _, members in groups]
    listed = duplicates.jsonl(groups, config.layout.classes)

    def info(splits):
        return duplicates.info_block(members, duplicates.first_split(splits))

    return [Block("duplicates", info, ((duplicates.DUPLICATES_FILE, listed),))]


def summary_lines(info: dict) -> list[str]:
    """The end-of-run lines of imagerecords.json's ``duplicates`` block."""
    first = duplicates.first_split(list(info["splits"]))
    deduped = bool(info.get("config", {}).get("dedupe"))
    return duplicates.summary_lines(info.get("duplicates") or {}, first, deduped)


LOCAL = LocalStep(NAME, run_local, blocks)

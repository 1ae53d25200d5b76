"""Near duplicates as the engines wire them: the local step, the ``near_duplicates``
block and the ``label_conflicts`` one (identical copies, and near ones under
``--dedupe near``, in two classes)."""

from __future__ import annotations

from beam_pipeline.core import counters
from beam_pipeline.core.images import PixelHook
from beam_pipeline.features.dedupe import duplicates
from beam_pipeline.features.dedupe import feature as dedupe
from beam_pipeline.features.near import hashes, search, stage
from beam_pipeline.stages.hooks import Block, LocalStep, fixed

NAME = "near"
# What convert computes of every stored image: the fingerprint, from the pixels a
# pass-through JPEG's check decode covers (the hash's base), and its scheme.
PIXELS = PixelHook(
    search.SCHEME,
    search.EARLIER_SCHEMES,
    search.SAME_FINGERPRINT,
    hashes.BASE_SIDE,
    search.pack_image,
    search.features,
)


def run_local(config, batches, counted):
    """The near-duplicate groups; under --dedupe near, the batches without the copies."""
    found = stage.find_local(batches, config.spill_directory)
    counted[counters.NEAR_PAIRS] += sum(len(g.pairs) for g in found.groups)
    if not (config.dedupe_near and found.groups):
        return batches, [], found
    batches, copies = stage.drop_all_near(batches, found)
    counted[counters.DROPPED_AS_NEAR] += len(copies)
    return batches, copies, found


def blocks(config, results) -> list[Block]:
    """``near_duplicates`` with near_duplicates.jsonl, and ``label_conflicts`` of the
    exact groups (the dedupe step's result, when it ran) and the near ones."""
    found = results.get(NAME) or stage.Found()
    classes = config.layout.classes
    exact = [members for _, members in results.get(dedupe.NAME, ())]
    near = [g.members for g in found.groups]
    conflicts = duplicates.run_conflicts(exact, near, config.dedupe, search.keeper)
    block = search.info_block(found.groups, found.oversized, found.untextured)
    listed = search.jsonl(found.groups, classes)
    return [
        fixed("near_duplicates", block, ((search.NEAR_FILE, listed),)),
        fixed("label_conflicts", duplicates.conflicts_block(conflicts, classes)),
    ]


def summary_lines(info: dict) -> list[str]:
    """The end-of-run lines of the ``label_conflicts`` and ``near_duplicates`` blocks."""
    conflicts = duplicates.conflict_lines(info.get("label_conflicts"))
    return conflicts + search.summary_lines(info.get("near_duplicates") or {})


LOCAL = LocalStep(NAME, run_local, blocks)

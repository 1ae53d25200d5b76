"""--reuse as the engines wire it: the ``reuse`` block (the conversion's part: stage.py)."""

from __future__ import annotations

from beam_pipeline.stages.hooks import Block, fixed


def blocks(config, reused: int) -> list[Block]:
    """The ``reuse`` block: it describes the run, not the data (all else is what a
    full conversion writes); none without --reuse."""
    if not config.reuse:
        return []
    return [fixed("reuse", {"dataset": config.reuse, "images_reused": reused})]

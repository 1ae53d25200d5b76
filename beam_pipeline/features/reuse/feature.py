"""--reuse as the engines wire it: the conversion's hook for an image OLD holds
(:func:`take_or_convert`, ``convert.Prior``) and the ``reuse`` block."""

from __future__ import annotations

from beam_pipeline.core import keys
from beam_pipeline.core.elements import Converted, ImageRef, Outcome, ShardEntry
from beam_pipeline.features.reuse import stage as reuse
from beam_pipeline.stages.convert import decode_data, decode_path, finish, unreadable
from beam_pipeline.stages.hooks import Block, fixed
from beam_pipeline.storage import gcs
from beam_pipeline.storage.reading import hash_source


def take_or_convert(ref: ImageRef, old: reuse.OldRecord, spec, seed, classes) -> Outcome:
    """The record OLD holds for ``ref``'s ID when the source has not changed; else
    a conversion of the source. Either way the bytes a full conversion would write.

    A reused record is its bytes as :func:`reuse.take` read and checked them,
    never a reference into OLD's shard: what is copied into the output later
    is what was checked, whatever happens to OLD meanwhile.
    """
    image_id, path, label = ref.image_id, ref.path, ref.label
    try:
        sha256, size, data = hash_source(path)
    except Exception as error:  # an unreadable file is a rejection, as in a full run
        gcs.raise_if_unreachable(error, path)  # but GCS out of reach stops the run
        return finish(ref, unreadable(error), seed, classes)
    taken = reuse.take(old, image_id, sha256, label, classes[label], spec.pixels)
    if taken is not None:
        key = keys.order_key(seed, image_id)
        entry = ShardEntry(key, image_id, label, len(taken.framed), taken.framed, path, sha256)
        entry = entry._replace(near=taken.near)
        return Outcome(
            Converted(ref.split, entry), size, False, reused=True, near_hashed=taken.near_hashed
        )
    if data is None:  # changed: read it, and hash what is converted (it may change again)
        return finish(ref, decode_path(path, spec), seed, classes)
    return finish(ref, decode_data(data, spec, path, sha256), seed, classes)


def blocks(config, reused: int) -> list[Block]:
    """The ``reuse`` block: it describes the run, not the data (all else is what a
    full conversion writes); none without --reuse."""
    if not config.reuse:
        return []
    return [fixed("reuse", {"dataset": config.reuse, "images_reused": reused})]

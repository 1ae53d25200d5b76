"""Which engine runs a job: the local engine or the Beam graph.

The command line runs the engine this chooses, and the dry run reports it;
both ask here, so they cannot disagree.
"""

from __future__ import annotations

from beam_pipeline.storage import paths


def all_local(layout, output: str) -> bool:
    """Every input image and the output are local (a manifest may name gs:// images)."""
    if layout.kind == "manifest":
        return layout.manifest_all_local and paths.is_local(output)
    return paths.is_local(layout.root) and paths.is_local(output)


LOCAL_ENGINE = "local"
BEAM = "beam"


def choose_engine(beam, layout, output: str) -> str:
    """:data:`LOCAL_ENGINE` for a job that names no Beam option and whose input
    images (a folder, or every path of a manifest) and output are local;
    :data:`BEAM` for every other job.

    The local engine runs the same stages with the same code as the Beam
    graph, without Beam (local_engine.py): the same bytes, without Beam's
    start-up. Any Beam flag (``--runner DirectRunner`` is the simplest) runs the
    job on Beam instead.

    ``beam``: Beam's flags (``arguments.parse_args``'s), true when any is given.
    """
    if beam:
        return BEAM
    return LOCAL_ENGINE if all_local(layout, output) else BEAM

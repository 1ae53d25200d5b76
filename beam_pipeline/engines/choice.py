"""Which engine runs a job, and with how many local processes: :func:`plan`.

The command line runs the engine this plans (``job.check``), and the dry run
reports it; both ask here, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import os

from beam_pipeline.beam_internals import beam_options
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


def with_local_defaults(
    beam: beam_options.BeamFlags, processes: int | None
) -> tuple[beam_options.BeamFlags, int]:
    """DirectRunner with no explicit mode: use every core, not one in-memory thread.

    Returns Beam's flags (with the mode added) and the number of local
    conversion processes (1: none beside the runner's own workers).
    ``multi_threading`` is avoided on purpose (docs/format.md section 5: it was seen
    to lose records under load).
    """
    if not beam.on_direct_runner:
        return beam, 1
    mode = beam.direct_running_mode
    if mode is not None:
        return beam, (processes or 1) if mode == "in_memory" else 1
    extra = ["--direct_running_mode=in_memory"]
    if not beam.given("pipeline_type_check"):
        # Beam's construction-time type checks guard user-written pipelines; this
        # one is fixed and tested, and checking it costs CPU on every run while
        # the conversion processes need the cores.
        extra.append("--no_pipeline_type_check")
    return beam.plus(extra), processes or os.cpu_count() or 1


def direct_workers(beam: beam_options.BeamFlags, processes: int) -> int:
    """The processes that convert on a DirectRunner run: the local pool's in the
    ``in_memory`` mode, else Beam's workers (``--direct_num_workers``: Beam's
    default 1; 0 is one per core)."""
    if beam.direct_running_mode == "in_memory":
        return processes
    return beam.get("direct_num_workers", 1) or os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Engine:
    """How a job runs: the engine, Beam's flags as it runs them, its local processes."""

    name: str  # LOCAL_ENGINE or BEAM
    beam: beam_options.BeamFlags  # with the local defaults (with_local_defaults)
    processes: int  # of the local pool (1: none beside the runner's own workers)

    @property
    def local(self) -> bool:
        return self.name == LOCAL_ENGINE

    @property
    def pooled(self) -> bool:
        """Whether the job converts on a local pool that spills (the local engine,
        the pooled DirectRunner path)."""
        return self.local or self.processes > 1

    @property
    def converting(self) -> int:
        """The processes that convert on this machine (a DirectRunner's in any mode)."""
        return self.processes if self.local else direct_workers(self.beam, self.processes)


def plan(beam: beam_options.BeamFlags, local_processes: int | None, layout, output: str) -> Engine:
    """The engine :func:`choose_engine` picks, with the local defaults filled in.

    ``beam``: Beam's flags as given; ``local_processes``: ``--local_processes``.
    """
    run_with, processes = with_local_defaults(beam, local_processes)
    return Engine(choose_engine(beam, layout, output), run_with, processes)

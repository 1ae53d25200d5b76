"""Apache Beam's DaskRunner with the translation fixes this job needs.

Replaces the ParDo and Reshuffle translations and the graph walk of Beam's runner
(tagged outputs kept apart, side inputs in the one graph, a real Reshuffle, each
partition its own DoFn); what each fixes: docs/dask.md. Loads only with
``beam_private.BEAM_VERSION``.
"""

from __future__ import annotations

import collections
import itertools
import logging
import zlib

from beam_pipeline.beam_internals import beam_private

# What follows replaces parts of Beam's private Dask translation, read against
# one Beam; with another there is nothing public to fall back to, and a
# changed internal could break a job midway or mix its outputs: refused, in
# one line, before any of Beam's private modules is imported.
beam_private.require_beam_for_dask()

import apache_beam as beam  # noqa: E402
import dask.bag as dask_bag  # noqa: E402
from apache_beam import pvalue  # noqa: E402
from apache_beam.internal import pickler  # noqa: E402
from apache_beam.pipeline import PipelineVisitor  # noqa: E402
from apache_beam.runners.common import (  # noqa: E402
    DoFnContext,
    DoFnInvoker,
    DoFnSignature,
    Receiver,
    _OutputHandler,
)
from apache_beam.runners.dask import dask_runner as beam_dask  # noqa: E402
from apache_beam.runners.dask import transform_evaluator as beam_ops  # noqa: E402
from apache_beam.runners.dask.overrides import _Reshuffle  # noqa: E402
from apache_beam.transforms.sideinputs import SideInputMap  # noqa: E402
from apache_beam.utils.windowed_value import WindowedValue  # noqa: E402
from dask.base import tokenize  # noqa: E402
from dask.highlevelgraph import HighLevelGraph  # noqa: E402

# Beam's Create translation warns on every run that its default partition size
# changed in an earlier Beam release; nothing for a user of this CLI to act on.
logging.getLogger(beam_ops.__name__).setLevel(logging.ERROR)

# Partitions a Reshuffle spreads over, per worker thread, when
# --dask_npartitions is not given: a little more than one, so a slow partition
# does not hold up the whole stage.
PARTITIONS_PER_THREAD = 2


class _Receiver(Receiver):
    """Collects one output tag's elements of a bundle as (tag, value) pairs."""

    def __init__(self, tag, out: list):
        self._tag, self._out = tag, out

    def receive(self, windowed_value: WindowedValue):
        self._out.append((self._tag, windowed_value.value))


class _Receivers(dict):
    def __init__(self, out: list):
        super().__init__()
        self._out = out

    def __missing__(self, tag):
        self[tag] = _Receiver(tag, self._out)
        return self[tag]


def _run_bundle(items, pickled: bytes, *side_values):
    """One dask partition = one Beam bundle of a ParDo -> [(tag, value)]."""
    label, fn, args, kwargs, window_fn, side_views = pickler.loads(pickled)
    side_inputs = [
        SideInputMap(
            view_class,
            options,
            [WindowedValue(v, 0, (beam.window.GlobalWindow(),)) for v in values],
        )
        for (view_class, options), values in zip(side_views, side_values, strict=True)
    ]
    out: list = []
    receivers = _Receivers(out)
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn),
        _OutputHandler(
            window_fn=window_fn,
            main_receivers=receivers[None],
            tagged_receivers=receivers,
            per_element_output_counter=None,
            output_batch_converter=None,
            process_yields_batches=False,
            process_batch_yields_elements=False,
        ),
        context=DoFnContext(label, state=None),
        side_inputs=side_inputs,
        input_args=args,
        input_kwargs=kwargs,
        user_state_context=None,
        bundle_finalizer_param=beam.DoFn.BundleFinalizerParam(),
    )
    invoker.invoke_setup()
    invoker.invoke_start_bundle()
    for item in items:
        invoker.invoke_process(beam_ops.get_windowed_value(item, window_fn))
    invoker.invoke_finish_bundle()
    invoker.invoke_teardown()
    return out


def _concat(parts):
    return list(itertools.chain.from_iterable(parts))


def _select(bag, tag):
    """The elements of one output of a ParDo's (tag, value) bag."""
    return bag.map_partitions(_values_of, tag)


def _values_of(pairs, tag) -> list:
    return [value for t, value in pairs if t == tag]


def _materialized(bag):
    """The bag with each partition a list.

    dask.bag's own map, filter and flatten leave a partition as a lazy
    iterator. A partition that two transforms consume (a PCollection read by
    two steps) is then one iterator that the first consumer exhausts: the
    second sees only what is left (elements were lost that way).
    """
    return bag.map_partitions(list)


def _spread_key(element) -> int:
    # Deterministic (unlike a random key), so a task the scheduler recomputes
    # after losing a worker sends every element where it sent it before.
    return zlib.crc32(repr(element).encode())


class DaskRunner(beam_dask.DaskRunner):
    """Beam's DaskRunner with the fixes in this module's docstring."""

    def run_pipeline(self, pipeline, options):
        import distributed

        dask_options = options.view_as(beam_dask.DaskOptions).get_all_options(
            drop_default=True, current_only=True
        )
        bag_kwargs = beam_dask.DaskOptions._extract_bag_kwargs(dask_options)
        client = distributed.Client(**dask_options)
        try:
            if not bag_kwargs.get("npartitions"):
                threads = sum(client.nthreads().values()) or 1
                bag_kwargs["spread"] = PARTITIONS_PER_THREAD * threads
            pipeline.replace_all(beam_dask.dask_overrides())
            visitor = _Visitor(bag_kwargs)
            pipeline.visit(visitor)
            futures = client.compute(visitor.leaves())
        except BaseException:
            client.close()
            raise
        return beam_dask.DaskRunnerResult(client, futures)


class _Visitor(PipelineVisitor):
    """Beam transforms -> dask bags, one bag per leaf transform."""

    def __init__(self, bag_kwargs: dict):
        self._bag_kwargs = bag_kwargs
        self.bags = collections.OrderedDict()  # AppliedPTransform -> Bag
        self._tagged = set()  # transforms whose bag holds (tag, value) pairs
        self._consumed = set()

    def leaves(self) -> list:
        return [bag for node, bag in self.bags.items() if node not in self._consumed]

    def _bag_of(self, pcoll):
        producer = pcoll.producer
        self._consumed.add(producer)
        bag = self.bags[producer]
        return _select(bag, pcoll.tag) if producer in self._tagged else bag

    def visit_transform(self, node) -> None:
        transform = node.transform
        inputs = [self._bag_of(i) for i in node.inputs if not isinstance(i, pvalue.PBegin)]
        if type(transform) is beam.ParDo:
            self.bags[node] = self._par_do(node, inputs[0])
            self._tagged.add(node)
        elif isinstance(transform, _Reshuffle):
            self.bags[node] = self._reshuffle(inputs[0])
        else:
            kwargs = {k: v for k, v in self._bag_kwargs.items() if k != "spread"}
            op = beam_ops.TRANSLATIONS.get(type(transform), beam_ops.NoOp)(node, bag_kwargs=kwargs)
            if isinstance(op, beam_ops.Flatten):
                bag = op.apply(inputs)
            else:
                bag = op.apply(inputs[0] if inputs else None)
            self.bags[node] = bag if isinstance(op, beam_ops.Create) else _materialized(bag)

    def _par_do(self, node, bag):
        transform = node.transform
        args, kwargs = transform.raw_side_inputs
        main = next(iter(node.main_inputs.values()))
        window_fn = main.windowing.windowfn if hasattr(main, "windowing") else None
        views = [(type(side), side._view_options()) for side in node.side_inputs]
        pickled = pickler.dumps(
            (transform.label, transform.fn, list(args), kwargs, window_fn, views)
        )
        # One Item per side input: computed once, before its consumers.
        items = [self._bag_of(s.pvalue).reduction(list, _concat) for s in node.side_inputs]
        # A layer of plain tasks, not bag.map_partitions: given Items as
        # arguments, map_partitions puts a copy of each Item's whole upstream
        # graph into the job (dask 2026.8), and every copy runs.
        name = f"beam-{tokenize(bag.name, pickled, *[item.key for item in items])}"
        tasks = {
            (name, i): (_run_bundle, (bag.name, i), pickled, *[item.key for item in items])
            for i in range(bag.npartitions)
        }
        graph = HighLevelGraph.from_collections(name, tasks, dependencies=[bag, *items])
        return dask_bag.Bag(graph, name, bag.npartitions)

    def _reshuffle(self, bag):
        partitions = self._bag_kwargs.get("npartitions") or self._bag_kwargs["spread"]
        if bag.npartitions < partitions:
            bag = bag.repartition(npartitions=partitions)
        return bag.groupby(_spread_key, shuffle="tasks").map_partitions(_ungroup)


def _ungroup(groups) -> list:
    return [value for _, values in groups for value in values]

"""Benchmark harness for imagerecords (issue 5): ``python -m bench`` / ``make bench``.

It measures the converter (``python -m beam_pipeline``) against a codec floor and
the naive tutorial loop, and the reader (``reader.make_dataset``) against the
usual Keras / tf.data pipelines, on the same generated images in the same run,
and writes ``bench/results/results.{md,json}`` and ``chart.png``.

Modules, one job each:

* ``settings``  - the full and ``--quick`` sizes, paths.
* ``data``      - deterministic "web" and "phone" image sets from real photos.
* ``procstats`` - run a command, time it, sample the RSS of its process tree.
* ``machine``   - the machine description (CPU, RAM, versions, load).
* ``convert_floor``, ``convert_naive`` - the two converter baselines (runnable).
* ``converters`` - runs the three converters on each set.
* ``read_pipelines``, ``read_worker``, ``readers`` - the reader benchmark.
* ``report``    - Markdown table, JSON and PNG chart.
* ``profiling`` - cProfile / py-spy / stage ablations (``python -m bench.profiling``).
"""

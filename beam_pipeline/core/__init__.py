"""The pure core: what a record, a key, a split, a spill file and the books are.

Imports neither Beam nor any storage client, and nothing from the layers above
(storage, stages, engines, the command line); tests/test_layers.py checks it.
"""

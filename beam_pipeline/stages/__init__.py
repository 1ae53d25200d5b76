"""The job's stages as Beam-free functions and classes that both engines call:
convert an image, plan and write shards, finalize, resume, reuse.

Imports the core and storage, never an engine or the command line
(tests/test_layers.py).
"""

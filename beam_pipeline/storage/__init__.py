"""Where files are: paths and URLs, finding the images, writing the output, the lock.

Local disk directly; gs:// through the storage client or Beam's public
FileSystems. Imports only the core below it (tests/test_layers.py).
"""

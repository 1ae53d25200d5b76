"""Fixtures shared by several test modules (pytest finds them here by name).

The GCS fixtures live in :mod:`tests.gcs_fixtures` with the emulator they
drive; see its docstring for what each one gives.
"""

import importlib.util

# In `make test-torch`'s venv: torchvision loads triton, which crashes the
# process (SIGSEGV) when TensorFlow was imported before it (triton 3.8, TF
# 2.21); the other order works. Test modules import TensorFlow as they are
# collected, so torchvision goes first, before any of them.
if importlib.util.find_spec("torchvision") is not None:
    import torchvision  # noqa: F401

from tests.gcs_fixtures import (  # noqa: E402, F401 (pytest collects fixtures by name)
    gcs_account,
    gcs_bucket,
    gcs_emulator,
    gcs_proxy,
    tf_gcs_env,
)

"""Fixtures shared by several test modules (pytest finds them here by name).

The GCS fixtures live in :mod:`tests.gcs_fixtures` with the emulator they
drive; see its docstring for what each one gives.
"""

from tests.gcs_fixtures import (  # noqa: F401 (pytest collects fixtures by name)
    gcs_account,
    gcs_bucket,
    gcs_emulator,
    gcs_proxy,
    tf_gcs_env,
)

"""The local pool's in-process record store (park/unpark): pure, no Beam."""

import pytest

from beam_pipeline import local_pool


def test_park_keeps_bytes_once_and_returns_their_size():
    assert local_pool.park("cat/1.jpg", b"abcde") == 5
    assert local_pool.unpark("cat/1.jpg") == b"abcde"
    with pytest.raises(RuntimeError, match="not parked in this process.*in_memory"):
        local_pool.unpark("cat/1.jpg")


def test_shutdown_forgets_parked_records():
    local_pool.park("dog/2.jpg", b"x")
    local_pool.shutdown_all()
    with pytest.raises(RuntimeError, match="dog/2.jpg"):
        local_pool.unpark("dog/2.jpg")

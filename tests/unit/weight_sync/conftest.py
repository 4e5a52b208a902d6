"""Fixtures for the weight-sync tests."""

import pytest
from weight_sync_helpers import ReceiverProcess


@pytest.fixture
def receivers():
    started: list[ReceiverProcess] = []
    yield started
    for receiver in started:
        receiver.kill()

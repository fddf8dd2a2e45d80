"""Fixtures shared by the unit tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run the test on one CPU thread (steadier timings and profiles), then restore the count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

"""tfm_course.glue: what the book stores and what a reader outside the book sees."""

import numpy as np
import pytest
import torch

from tfm_course import glue as glue_module
from tfm_course.glue import glue, plain, shown


@pytest.mark.parametrize("value, want", [
    (np.float64(99.5), 99.5), (np.float32(0.25), 0.25), (np.int64(3), 3), (np.bool_(True), True),
    (torch.tensor(2.5), 2.5), (torch.tensor(7), 7), (np.array(4.0), 4.0),
])
def test_numpy_and_tensor_scalars_become_python_numbers(value, want):
    got = plain(value)
    assert type(got) is type(want) and got == want
    if not isinstance(got, bool):  # myst-nb formats {glue:text}`name:.1f` from the repr
        float(repr(got))


@pytest.mark.parametrize("value", [1.5, 3, "text", torch.tensor([1.0, 2.0]), np.array([1, 2])])
def test_other_values_are_stored_as_they_are(value):
    assert plain(value) is value


def test_the_book_receives_plain_numbers(monkeypatch):
    stored = {}
    monkeypatch.setattr(glue_module, "_myst_glue", lambda name, value, display: stored.update({name: value}))
    glue("accuracy", np.float64(0.875))
    assert type(stored["accuracy"]) is float and repr(stored["accuracy"]) == "0.875"


def test_outside_the_book_glue_prints_the_value(monkeypatch, capsys):
    monkeypatch.setattr(glue_module, "_myst_glue", None)
    glue("speedup", np.float64(6.81234))
    glue("steps", np.int64(1200))
    assert capsys.readouterr().out == "speedup = 6.812\nsteps = 1200\n"
    assert shown(2.0) == "2"

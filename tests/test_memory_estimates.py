"""Every built-in method declares the parameters it adds (`AttentionMethod.extra_parameters`), which the grid's
preflight counts against memory: an estimate below what `attach` really adds would let an impossible run start."""
from __future__ import annotations

import pytest

from suite.api.attention import METHODS
from suite.testing import tiny_config, tiny_model


def count(params) -> int:
    return sum(p.numel() for p in params)


@pytest.mark.parametrize("name", sorted(METHODS.names()))
def test_declared_parameters_cover_what_attach_adds(name):
    cls = METHODS.get(name)
    method = cls(cls.Config())
    model = tiny_model()
    before = count(model.parameters())
    method.attach(model)
    added = count(model.parameters()) - before
    own = count(method.generator.parameters()) if hasattr(method, "generator") else 0  # AttendOut's G-Net
    assert method.extra_parameters(tiny_config()) == added + own


@pytest.mark.parametrize("shared", [False, True])
def test_attendout_counts_its_generator(shared):
    cls = METHODS.get("attendout")
    method = cls(cls.Config(d_g=8, shared_generator=shared))
    method.attach(tiny_model())
    assert method.extra_parameters(tiny_config()) == count(method.generator.parameters()) > 0

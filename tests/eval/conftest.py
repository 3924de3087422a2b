"""Fixtures shared by the eval tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok(tmp_path_factory):
    """A small trained tokenizer (the tiny test checkpoints'), built once."""
    pytest.importorskip("tokenizers")
    from tests.support.models import make_tokenizer

    return make_tokenizer(tmp_path_factory.mktemp("tok"))

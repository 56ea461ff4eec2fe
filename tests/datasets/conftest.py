"""Dataset tests never touch the network: downloads are switched off unless a test serves
files itself (``tests/datasets/test_download.py`` runs a local HTTP server)."""

import pytest

from hiergraph.datasets.download import OFFLINE_ENV, PLANETOID_SHA256


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv(OFFLINE_ENV, "1")


@pytest.fixture(autouse=True)
def pinned_checksums():
    """The Planetoid checksums as pinned, after a test that pinned its own files' as the
    official ones (``fixtures.trust_planetoid``)."""
    pinned = dict(PLANETOID_SHA256)
    yield
    PLANETOID_SHA256.clear()
    PLANETOID_SHA256.update(pinned)

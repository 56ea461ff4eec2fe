"""Dataset tests never touch the network: downloads are switched off unless a test serves
files itself (``tests/datasets/test_download.py`` runs a local HTTP server)."""

import pytest

from hiergraph.datasets.download import OFFLINE_ENV


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv(OFFLINE_ENV, "1")

import pytest

from hiergraph._environment import env_flag


@pytest.mark.parametrize(
    "value, default, expected",
    [
        (None, True, True),
        (None, False, False),
        (" On ", False, True),
        ("YES", False, True),
        ("1", False, True),
        ("off", True, False),
        ("False", True, False),
        ("0", True, False),
        ("maybe", True, True),  # anything else: the default
        ("maybe", False, False),
        ("", False, False),
    ],
)
def test_env_flag(monkeypatch, value, default, expected):
    if value is None:
        monkeypatch.delenv("HIERGRAPH_TEST_FLAG", raising=False)
    else:
        monkeypatch.setenv("HIERGRAPH_TEST_FLAG", value)
    assert env_flag("HIERGRAPH_TEST_FLAG", default) is expected

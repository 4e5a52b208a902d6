"""`tx models make-tiny NAME --preset vlm`: a tiny Qwen3-VL whose processor counts tokens like the cookbook's,
and the image settings of `tx serve`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tx.cli import build_parser
from tx.config import Settings

NAME = "Qwen/Qwen3-VL-30B-A3B-Instruct"


def test_make_tiny_vlm_in_hf_cache_loads_offline_by_name(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HF_HOME", "TRANSFORMERS_CACHE")}
    made = subprocess.run([sys.executable, "-m", "tx.cli", "models", "make-tiny", NAME, "--preset", "vlm",
                           "--hf-home", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    snapshot = Path(made.stdout.strip().splitlines()[-1])
    assert (snapshot / "preprocessor_config.json").is_file() and (snapshot / "config.json").is_file()
    code = textwrap.dedent(f"""
        from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer
        from tx.models import resolve_model_dir
        processor = AutoImageProcessor.from_pretrained("{NAME}")
        tokenizer = AutoTokenizer.from_pretrained("{NAME}")
        model = AutoModelForImageTextToText.from_pretrained("{NAME}")
        counts = [processor.get_number_of_image_patches(h, w, images_kwargs={{}}) // processor.merge_size**2
                  for w, h in [(64, 48), (32, 32), (480, 360)]]
        ids = tokenizer.convert_tokens_to_ids(["<|image_pad|>", "<|vision_start|>", "<|im_end|>"])
        print(counts, ids, model.config.image_token_id, resolve_model_dir("{NAME}").name)
    """)
    env.update(HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["[70,", "64,", "165]", "[2005,", "2003,", "2002]", "2005", snapshot.name]


def test_image_settings_from_flags(tmp_path: Path) -> None:
    args = build_parser().parse_args([
        "serve", "--asset-root", str(tmp_path), "--asset-host", "images.example:8443",
        "--asset-allow-private",
        "--asset-allowed-network", "10.1.0.0/16", "--image-max-pixels", "1000", "--image-max-bytes", "2000",
        "--asset-fetch-timeout-s", "3",
    ])
    fields = {k: v for k, v in vars(args).items() if v is not None and k != "command"}
    settings = Settings(**fields)
    images = settings.images
    assert images.asset_roots == [tmp_path] and images.asset_hosts == ["images.example:8443"]
    assert images.asset_allow_private and images.asset_allowed_networks == ["10.1.0.0/16"]
    limits = (images.max_pixels, images.max_bytes, images.asset_fetch_timeout_s)
    assert limits == (1000, 2000, 3)
    defaults = Settings().images
    assert not defaults.asset_roots and not defaults.asset_hosts and not defaults.asset_allow_private
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        Settings(asset_allowed_networks=["not-a-network"])

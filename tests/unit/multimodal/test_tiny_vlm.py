"""`tx models make-tiny NAME --preset vlm`: a tiny Qwen3-VL whose processor counts tokens like the cookbook's,
and the image settings of `tx serve`."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import background
import pytest

from tx.cli import build_parser
from tx.config import Settings

NAME = "Qwen/Qwen3-VL-30B-A3B-Instruct"


LOAD_BY_NAME = textwrap.dedent(f"""
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


def make_and_load(directory: Path) -> background.Job:
    """`tx models make-tiny NAME --preset vlm --hf-home DIR`, then a fresh process loading NAME offline from DIR:
    each step's (returncode, stdout, stderr) as one JSON line, the make-tiny step first."""
    script = textwrap.dedent(f"""
        import json, os, subprocess, sys
        env = {{k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HF_HOME", "TRANSFORMERS_CACHE")}}
        home = {str(directory / "hf")!r}
        made = subprocess.run([sys.executable, "-m", "tx.cli", "models", "make-tiny", {NAME!r}, "--preset", "vlm",
                               "--hf-home", home], capture_output=True, text=True, env=env, timeout=300)
        print(json.dumps([made.returncode, made.stdout, made.stderr]), flush=True)
        if made.returncode == 0:
            env.update(HF_HOME=home, HF_HUB_OFFLINE="1")
            out = subprocess.run([sys.executable, "-c", {LOAD_BY_NAME!r}], capture_output=True, text=True, env=env,
                                 timeout=300)
            print(json.dumps([out.returncode, out.stdout, out.stderr]), flush=True)
    """)
    return background.Job([sys.executable, "-c", script])


# Two fresh processes importing transformers (~12 s): started niced as soon as this test is collected
# (tests/background.py), so they run in the time the tests before it leave idle.
BACKGROUND_JOBS = {"tiny-vlm-by-name": make_and_load}


def test_make_tiny_vlm_in_hf_cache_loads_offline_by_name() -> None:
    done = background.result("tiny-vlm-by-name", make_and_load)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    made_code, made_out, made_err = steps[0]
    assert made_code == 0, made_err[-2000:]
    snapshot = Path(made_out.strip().splitlines()[-1])
    assert (snapshot / "preprocessor_config.json").is_file() and (snapshot / "config.json").is_file()
    out_code, out, err = steps[1]
    assert out_code == 0, err[-3000:]
    assert out.split() == ["[70,", "64,", "165]", "[2005,", "2003,", "2002]", "2005", snapshot.name]


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

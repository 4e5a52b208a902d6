"""The JAX backend on a 2-device mesh gives the 1-device result (CPU devices forced by XLA_FLAGS).

XLA_FLAGS must be set before jax starts, so the comparison runs in a fresh Python process (a niced background
job from collection on: tests/background.py).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import background
import numpy as np
import pytest

pytest.importorskip("jax")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from pathlib import Path
    from backend_helpers import TINY_NAME, ce, sft_data
    from tx.backends.jax.backend import JaxBackend
    from tx.optimizers import AdamParams
    from tx.types import LoraConfig

    model_dir = Path(sys.argv[1])
    results = []
    for devices in (1, 2):
        backend = JaxBackend({TINY_NAME: model_dir}, num_devices=devices)
        backend.create_model("m", TINY_NAME, LoraConfig(rank=4, seed=0))
        data = sft_data(seed=1, count=4, length=21)
        backend.forward_backward("m", ce(data))
        backend.optim_step("m", AdamParams(learning_rate=1e-2, weight_decay=0.1))
        out = backend.forward_backward("m", ce(data))
        grads = {k: v.numpy().tolist() for k, v in backend.gradients("m").items()}
        backend.optim_step("m", AdamParams(learning_rate=1e-2, grad_clip_norm=1.0))
        weights = {k: v.numpy().tolist() for k, v in backend.iter_trainable_weights("m")}
        embed = backend._host(TINY_NAME).base["model.embed_tokens.weight"]
        results.append({
            "devices": backend.mesh.devices.size, "embed_split": not embed.sharding.is_fully_replicated,
            "loss": out.metrics["loss:sum"], "logprobs": [o["logprobs"].tolist() for o in out.loss_fn_outputs],
            "grads": grads, "weights": weights,
        })
    print(json.dumps(results))
    """
)


WRITE_TINY = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tx.models.tiny import write_tiny_text_model
    write_tiny_text_model(Path(sys.argv[1]), preset="tiny", seed=0)  # tests/conftest.py's tiny_model_dir
    """
)


def two_devices(directory: Path) -> background.Job:
    """The comparison, in a fresh process with 2 forced CPU devices, on the tiny model written first."""
    here = os.path.dirname(__file__)
    root = os.path.abspath(os.path.join(here, "..", "..", ".."))
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([root, here, os.environ.get("PYTHONPATH", "")])}
    return background.Job([sys.executable, "-c", WRITE_TINY + SCRIPT, str(directory / "tiny")], env=env,
                          timeout_s=300)


# ~20 s of one core: started niced as soon as the test is collected (tests/background.py)
BACKGROUND_JOBS = {"jax-two-devices": two_devices}


@pytest.mark.slow
def test_two_device_mesh_matches_one_device():
    proc = background.result("jax-two-devices", two_devices)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (one["devices"], two["devices"]) == (1, 2)
    assert two["embed_split"] and not one["embed_split"]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    for key in ("logprobs", "grads", "weights"):
        a, b = one[key], two[key]
        pairs = zip(a, b) if isinstance(a, list) else ((a[k], b[k]) for k in a)
        for x, y in pairs:  # within 1e-5 of the tensor's scale (sums over devices change the float32 order)
            x, y = np.array(x), np.array(y)
            assert np.abs(y - x).max() <= 1e-5 * max(1.0, np.abs(x).max()), key

"""The SDK's HTTP connections against tx: no request may hang on a response the server already sent.

tinker 0.38.0 fetches `client/config` with a one-off httpx client on its background event loop and never
closes it. When the cyclic GC later finalizes that client in a thread with a running event loop (the
cookbook runs its recipes under `asyncio.run`), httpx's `__del__` schedules `aclose()` on that loop; it
calls `remove_reader(fd)` on the SDK loop's selector after the fd number was reused by a live connection,
typically a retrieve_future long-poll, which then never sees its response and stalls for the SDK's
45-60 s read timeout (about half the cookbook chat_sl runs did). tx answers `client/config` with
`Connection: close`, so the client closes that connection at once, on its own loop.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import httpx

from txserver import API_KEY, TxServer

# Cookbook-like use of the SDK: from inside a running asyncio loop on the main thread, with the GC
# finalizing leaked SDK objects there, then synchronous work on that thread while the SDK pipelines
# forward_backward + optim_step and long-polls their results. With the bug the first round hangs.
SCENARIO = textwrap.dedent(
    """
    import asyncio, gc, sys, time
    import tinker
    from tinker import types

    url, key, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tokens = [(37 * i) % 1900 + 10 for i in range(129)]
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(tokens[j:-1]),
            loss_fn_inputs={"target_tokens": tokens[j + 1:], "weights": [1.0] * (len(tokens) - 1 - j)},
        )
        for j in range(16)
    ]

    async def main():
        for r in range(rounds):
            sc = tinker.ServiceClient(base_url=url, api_key=key)
            tc = await sc.create_lora_training_client_async("tiny-qwen3", rank=8)
            gc.collect()  # finalizers of leaked SDK objects run here, with this loop running
            t0 = time.monotonic()
            fb = tc.forward_backward(data, "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=1e-3))
            time.sleep(0.1)  # synchronous work on the loop's thread, as a recipe does between awaits
            try:
                await asyncio.wait_for(asyncio.gather(fb, opt), 15)
            except asyncio.TimeoutError:
                print(f"STALL round {r}", flush=True)
                sys.exit(3)
            print(f"round {r}: {time.monotonic() - t0:.2f}s", flush=True)
            sc.holder.close()

    gc.disable()  # collect only where the scenario says
    asyncio.run(main())
    """
)


def test_client_config_closes_its_connection(server: TxServer) -> None:
    r = httpx.post(f"{server.url}/api/v1/client/config", json={"sdk_version": "0.38.0"},
                   headers={"X-API-Key": API_KEY})
    assert r.status_code == 200, r.text
    assert r.headers.get("connection", "").lower() == "close", r.headers


def test_pipelined_sdk_in_running_loop_does_not_stall(server: TxServer) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCENARIO, server.url, API_KEY, "3"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"scenario exited with {proc.returncode}:\n{out[-6000:]}"
    assert out.count("round ") == 3, out[-6000:]

"""A receiver process for the weight-sync tests: `python receiver_main.py` with a JSON job on stdin.

Job: {"rank": int, "out": path, "mode": "receive" | "exit_after_connect",
      "groups": [{"init": TransferInit, "update": TransferUpdate}, ...]}.
Groups are joined one after another (connect, receive, close), as an engine does after a restart. The tensors
received from group i are saved (cloned) with torch.save to f"{out}.{i}".
"""

import json
import sys

import torch

from tx.inference.weight_sync import BroadcastReceiver, TransferInit, TransferUpdate


def main() -> None:
    job = json.loads(sys.stdin.read())
    for index, group in enumerate(job["groups"]):
        init = TransferInit.model_validate(group["init"])
        receiver = BroadcastReceiver(init, rank=job["rank"], device=torch.device("cpu"))
        receiver.connect()
        if job.get("mode") == "exit_after_connect":
            return
        update = TransferUpdate.model_validate(group["update"])
        received = {name: tensor.clone() for name, tensor in receiver.receive(update)}
        receiver.close()
        torch.save(received, f"{job['out']}.{index}")


if __name__ == "__main__":
    main()

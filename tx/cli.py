"""The `tx` command: `tx serve`, `tx engine serve`, `tx models make-tiny`, `tx checkpoints export`, and the
`tx checkpoints` commands that talk to a running server (`import`, `merge`, `prune`: `client_commands.py`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from pydantic import ValidationError

from tx.config.names import AttnImplementation, EngineKindName, VllmLoraRank

if TYPE_CHECKING:
    from tx.config import Settings

logger = logging.getLogger("tx")
SHUTDOWN_GRACE_S = 1  # seconds


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the Tinker-compatible API server")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default 8000; 0 = any free port)")
    p.add_argument("--data-dir", type=Path, help="checkpoints, store and models (default ~/.tx)")
    p.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in the data directory)")
    p.add_argument(
        "--base-model", action="append", dest="base_models",
        help="a local model directory, or a hub id (org/name, org/name@revision) downloaded into the HF cache "
        "before the server is ready unless it is there; repeatable (default: the built-in tiny model)",
    )
    p.add_argument("--offline", action="store_true", default=None,
                   help="download no model: hub ids must be in the HF cache already (as HF_HUB_OFFLINE=1)")
    _debug_argument(p)
    p.add_argument("--api-key", action="append", dest="api_keys", help="accepted API key; repeatable")
    p.add_argument("--allowed-host", action="append", dest="allowed_hosts", metavar="NAME",
                   help="a name clients reach this server by, beyond localhost and its address (Host header, "
                   "against DNS rebinding); repeatable; '*' for any")
    p.add_argument("--operator-key", action="append", dest="operator_keys",
                   help="key for operator routes (/metrics, /api/v1/tx/engines) when API keys are set; "
                   "repeatable")
    p.add_argument("--key-label", action="append", dest="key_labels", metavar="KEY=LABEL",
                   help="a name for a key (KEY: the key, or its owner id), shown to operators in the console "
                   "instead of its owner id; repeatable")
    p.add_argument("--jwt-auth", action=argparse.BooleanOptionalAction, default=None,
                   help="clients exchange their key for a short-lived token, as the tinker SDK does (default on)")
    p.add_argument("--jwt-ttl-s", type=float, help="lifetime of an exchanged token (default 900)")
    p.add_argument("--backend", choices=("torch", "jax"), help="training backend (default torch; jax: the [jax] extra)")
    p.add_argument("--device", help="training device: auto, cpu, cuda, cuda:N")
    p.add_argument("--trainer-workers", type=int,
                   help="trainer worker processes training one model together (default 1: in the server process)")
    p.add_argument("--trainer-node-label", action="append", dest="trainer_node_labels", metavar="KEY=VALUE",
                   help="with --ray-address: a Ray node label the trainer workers' nodes carry; repeatable")
    _trainer_arguments(p)
    p.add_argument("--seq-gap-timeout-s", type=float, help="wait for a missing seq_id this long")
    p.add_argument("--max-request-bytes", type=int, help="largest forward_backward/asample body (200 MiB)")
    p.add_argument("--max-json-bytes", type=int, help="largest body of any other route (default 4 MiB)")
    p.add_argument("--console", action=argparse.BooleanOptionalAction, default=None,
                   help="serve the web console at /console (default: on)")
    p.add_argument("--engine", choices=get_args(EngineKindName), help="inference engine (default embedded)")
    p.add_argument("--engine-count", type=int,
                   help="engines tx starts per base model (default 1; 0 for a model with external engines)")
    p.add_argument("--engine-url", action="append", dest="engine_urls",
                   help="an external engine (tx engine serve) by URL; repeatable")
    p.add_argument("--engine-secret", help="the external engines' cluster secret (better: TX_ENGINE_SECRET)")
    p.add_argument("--engine-probe-interval-s", type=float,
                   help="how often an external engine that stopped answering is probed (default 2)")
    p.add_argument("--engine-tensor-parallel-size", type=int, help="GPUs per vLLM engine (default 1)")
    p.add_argument("--engine-memory-share", type=float, help="share of GPU memory per vLLM engine")
    p.add_argument("--vllm-python", help="the vLLM environment's Python, which runs the vLLM engines "
                   "(default: .venv-vllm in tx's checkout if there is one, else tx's own)")
    p.add_argument("--engine-dtype", choices=("float32", "bfloat16", "float16"),
                   help="engine dtype (default: the trainer's, --train-dtype)")
    p.add_argument(
        "--engine-colocate", action=argparse.BooleanOptionalAction, default=None,
        help="engines share the trainer's accelerator and sleep during training (default: on with a GPU)",
    )
    p.add_argument("--ray-address", help="place engines as Ray actors ('auto', 'host:port', or 'local')")
    p.add_argument("--engine-node-label", action="append", dest="engine_node_labels", metavar="KEY=VALUE",
                   help="with --ray-address: a Ray node label the engines' nodes carry; repeatable")
    p.add_argument("--engine-sleep-level", type=int, choices=(1, 2), help="sleep level for colocated engines")
    p.add_argument("--engine-training-wait-s", type=float,
                   help="a colocated training pass waits this long for in-flight samples, then pauses them (5)")
    p.add_argument("--engine-max-adapters", type=int, help="weight versions an engine keeps loaded (default 8)")
    p.add_argument("--engine-max-lora-rank", type=int,
                   help="the largest LoRA rank tx's vLLM engines take (vLLM --max-lora-rank; default 32)")
    p.add_argument(
        "--engine-standby", action=argparse.BooleanOptionalAction, default=None,
        help="start an embedded engine process with the server, imports done, no model (default: on)",
    )
    p.add_argument("--sampler-versions-kept", type=int, help="weight versions held per run (default 8)")
    _image_arguments(p)
    _quota_arguments(p)


def _debug_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", default=None, help="print the traceback of a refusal at start")


def _quota_arguments(p: argparse.ArgumentParser) -> None:
    """--quota-<name> for each quota of tx/core/quotas.py (defaults there and in tx/config.py)."""
    from tx.core.quotas import UNITS

    for quota, unit in UNITS.items():
        p.add_argument(f"--quota-{quota.replace('_', '-')}", type=int, dest=f"quota_{quota}",
                       help=f"per API key: most {unit}")
    p.add_argument("--sampling-dispatch-rows", type=int,
                   help="sequences in flight at one base model's engines, all keys (default: 2 x batch per engine)")


def _trainer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train-micro-batch-tokens", type=int,
                   help="tokens per trainer micro-batch (default 8192 on CPU, from free memory on CUDA)")
    p.add_argument("--train-dtype", choices=("float32", "bfloat16", "float16"),
                   help="dtype of the base weights (default bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--attn-implementation", choices=get_args(AttnImplementation),
                   help="attention of the trainer and embedded engines (default: the best the family supports)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute decoder activations in backward (default: on with CUDA)")
    p.add_argument("--trainer-shard-base", choices=("auto", "always", "never"),
                   help="trainer workers: shard the base with FSDP2 or hold it whole on each (default auto: "
                        "shard only a base that does not fit)")
    p.add_argument("--train-max-sequence-tokens", type=int,
                   help="longest datum accepted for training (default: the model's context)")
    p.add_argument("--shared-pass", choices=("auto", "on", "off"),
                   help="several runs' ready calls in one training pass (default auto: on with CUDA, off on CPU)")
    p.add_argument("--cpu-threads", type=int,
                   help="CPU threads the trainer and local engines share (default: this machine's CPUs)")
    p.add_argument("--trainer-threads", type=int,
                   help="the trainer's threads while a local engine runs (default: what the engines leave)")
    p.add_argument("--engine-threads", type=int,
                   help="threads of each local engine (default: cpu threads / (engines + 1))")


def _image_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image-max-bytes", type=int, help="largest image or asset, in bytes (default 20 MiB)")
    p.add_argument("--image-max-pixels", type=int, help="largest image, in pixels (default 4096*4096)")
    p.add_argument(
        "--asset-root", action="append", dest="asset_roots", type=Path,
        help="a directory image_asset_pointer may read files from; repeatable (default: none)",
    )
    p.add_argument(
        "--asset-host", action="append", dest="asset_hosts",
        help="a host (name or name:port) image_asset_pointer may fetch from; repeatable (default: none)",
    )
    p.add_argument(
        "--asset-allow-private", action=argparse.BooleanOptionalAction, default=None,
        help="let asset fetches reach loopback, private and link-local addresses (default: refused)",
    )
    p.add_argument(
        "--asset-allowed-network", action="append", dest="asset_allowed_networks",
        help="a network (CIDR) asset fetches may reach although it is not public; repeatable",
    )
    p.add_argument("--asset-fetch-timeout-s", type=float, help="time limit of one asset fetch (default 10)")
    p.add_argument("--audio-max-frames", type=int,
                   help="audio (DMel) frames over one prompt's or datum's clips (default 30000)")
    p.add_argument("--audio-max-bytes", type=int,
                   help="bytes of DMel data over one prompt's or datum's clips (default 8 MiB)")


def _make_tiny_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-tiny", help="write a tiny random model + tokenizer for offline use")
    p.add_argument("name", help="hub name to file it under, e.g. Qwen/Qwen3-8B; it picks the model family")
    p.add_argument("--hf-home", type=Path, help="HF home to write into (default $HF_HOME or ~/.cache/huggingface)")
    p.add_argument("--out", type=Path, help="write to this plain directory instead of an HF cache")
    p.add_argument(
        "--preset",
        help="the tiny model to write instead of the one the name's family gets: tiny (Qwen3), bench (~21M "
        "parameters), vlm (Qwen3-VL), qwen3_5, qwen3_5_vl, qwen3_5_moe, qwen3_5_moe_vl, qwen3_moe, deepseek_v3, "
        "gpt_oss, gemma3, llama, vocab-h64, vocab-h256",
    )
    p.add_argument("--seed", type=int, default=0)
    _debug_argument(p)


def _checkpoints_parser(sub: argparse._SubParsersAction) -> None:
    checkpoints = sub.add_parser("checkpoints", help="checkpoints on this server's disk")
    commands = checkpoints.add_subparsers(dest="checkpoints_command", required=True)
    p = commands.add_parser("export", help="write a checkpoint merged into its base model (an HF model directory)")
    p.add_argument("path", help="tinker://<run>/<kind>/<name> (under --data-dir) or a checkpoint directory")
    p.add_argument("--merge", type=Path, required=True, metavar="OUT",
                   help="write the adapter merged into its base model here (a new directory)")
    p.add_argument("--data-dir", type=Path, help="the server's data directory (default ~/.tx)")
    p.add_argument("--base-model", action="append", dest="base_models",
                   help="the base models the server serves, as for `tx serve` (default: the built-in one)")
    _debug_argument(p)
    _import_parser(commands)
    _merge_parser(commands)
    _prune_parser(commands)


def _url_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the server (default: $TINKER_BASE_URL, else http://127.0.0.1:8000)")


def _import_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "import", help="bring a PEFT LoRA adapter trained elsewhere into a server as a tinker:// checkpoint of yours",
        description="Uploads the adapter (adapter_config.json + adapter_model.safetensors) to the server at "
        "TINKER_BASE_URL with TINKER_API_KEY; prints the checkpoint's path, which create_training_client_from_state "
        "loads. Its optimizer state starts fresh.",
    )
    p.add_argument("directory", type=Path, help="the PEFT adapter directory")
    p.add_argument("--base-model", required=True, help="the served base model it was trained on")
    p.add_argument("--name", help="the checkpoint's name (default: the directory's name)")
    p.add_argument("--project-id", help="the project of the session that will hold it")
    _url_argument(p)


def _merge_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "merge", help="merge one of your checkpoints into its base model on a server, to download",
        description="The server at TINKER_BASE_URL merges the checkpoint (of TINKER_API_KEY) into its base model "
        "shard by shard and keeps the result as tinker://<run>/external_weights/<name>; `tinker checkpoint "
        "download` fetches it.",
    )
    p.add_argument("path", help="tinker://<run>/<kind>/<name>")
    p.add_argument("--name", required=True, help="the merged model's checkpoint name")
    p.add_argument("--ttl-s", type=int, help="expire it this many seconds from now (default: never)")
    _url_argument(p)


def _prune_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "prune", help="delete your checkpoints on a server by run or age, after showing them and asking",
        description="Lists the checkpoints of TINKER_API_KEY at TINKER_BASE_URL that match, with their sizes, and "
        "deletes them once confirmed; each deletion is in the audit log.",
    )
    p.add_argument("--run", action="append", dest="runs", metavar="RUN_ID", help="a run's checkpoints; repeatable")
    p.add_argument("--older-than", metavar="AGE", help="checkpoints made more than AGE ago: 30d, 12h, 2w, 90m")
    p.add_argument("--kind", action="append", dest="kinds", choices=("weights", "sampler_weights", "external_weights"),
                   help="only checkpoints of this kind; repeatable")
    p.add_argument("--yes", action="store_true", help="delete without asking")
    _url_argument(p)


def _engine_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="run one inference engine standalone, for a tx serve --engine-url elsewhere",
        description="Serves tx's engine contract until stopped. The cluster secret comes from the environment "
        "variable TX_ENGINE_SECRET (never argv).",
    )
    p.add_argument("--kind", choices=get_args(EngineKindName), default="embedded", help="engine (default embedded)")
    p.add_argument("--model", required=True,
                   help="a local model directory, or a hub id (org/name[@revision]) downloaded unless in the HF cache")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind: loopback or a private cluster address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8001, help="port to bind (default 8001; 0 = any free port)")
    p.add_argument("--ready-file", type=Path, help="write {url, pid} here once serving (for scripts)")
    p.add_argument("--max-adapters", type=int, default=8, help="weight versions kept loaded (default 8)")
    p.add_argument("--device", default="auto", help="embedded engine: auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="engine dtype (default float32; give the trainer's --train-dtype)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM engine: GPUs (default 1)")
    p.add_argument("--max-model-len", type=int, help="vLLM engine: --max-model-len")
    p.add_argument("--max-lora-rank", type=int, default=32, choices=get_args(VllmLoraRank),
                   help="vLLM engine: the largest LoRA rank it takes, vLLM's --max-lora-rank (default 32)")
    p.add_argument("--vllm-python", help="vLLM engine: the vLLM environment's Python, which runs it "
                   "(default: .venv-vllm in tx's checkout if there is one, else this one)")
    p.add_argument("--vllm-url",
                   help="vLLM engine: serve over a vLLM you started on this machine, on a Unix socket in a private "
                   "directory: unix:///path/to/vllm.sock (see --print-vllm-command)")
    p.add_argument("--print-vllm-command", action="store_true",
                   help="print the lines that start vLLM on a Unix socket (flags and environment tx's engine needs; "
                   "--vllm-url picks the socket) and tx engine serve over it, and exit")
    p.add_argument("--vllm-arg", action="append", dest="extra_vllm_args", default=[],
                   help="vLLM engine: one more `vllm serve` argument, e.g. --vllm-arg=--max-num-seqs=16; repeatable")
    _debug_argument(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tx", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    engine = sub.add_parser("engine", help="inference engines").add_subparsers(dest="engine_command", required=True)
    _engine_serve_parser(engine)
    models = sub.add_parser("models", help="model files").add_subparsers(dest="models_command", required=True)
    _make_tiny_parser(models)
    _checkpoints_parser(sub)
    return parser


def refuse(command: str, exc: BaseException, debug: bool | None) -> int:
    """A refusal at start: one line on stderr, naming the cause and the fix; the traceback too with --debug.
    Exit status 2 (docs/operations.md#start-up-errors)."""
    if debug:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    message = settings_line(exc) if isinstance(exc, ValidationError) else " ".join(str(exc).split())
    print(f"{command}: {message}", file=sys.stderr)
    return 2


def settings_line(exc: ValidationError) -> str:
    """Pydantic's several lines per error, as one: `--flag: what is wrong` for each."""
    from tx.config import Settings, sections

    parts = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        if loc and loc[-1] not in sections(Settings):  # a section's own check names its flags itself
            message = f"--{loc[-1].replace('_', '-')}: {message}"
        parts.append(message)
    return "invalid settings: " + "; ".join(parts)


def serve(args: argparse.Namespace) -> int:
    from tx.cpu import use_cpu_defaults

    use_cpu_defaults()  # before torch loads (it reads these once); engines and trainer workers inherit them
    import uvicorn

    from tx.api.app import create_app
    from tx.api.startup import StartupRefused, preflight
    from tx.config import PRIVATE_UMASK, Settings

    os.umask(PRIVATE_UMASK)  # the store, checkpoints and exports 0600: docs/security.md#the-data-directory

    overrides = {
        k: v for k, v in vars(args).items() if v is not None and k not in ("command", "func")
    }
    settings: Settings | None = None
    try:
        settings = Settings(**overrides)
        models = preflight(settings)  # data directory, port, store, models (downloaded): one line each
        if settings.engines.kind == "vllm":
            _check_vllm(settings, models)
    except (ValidationError, StartupRefused) as exc:
        return refuse("tx serve", exc, settings.debug if settings else args.debug)
    app = create_app(settings)
    logger.info("tx starting on http://%s:%d (TINKER_BASE_URL)", settings.host, settings.port)
    # On SIGTERM, open requests (SDK long-polls of retrieve_future hold one up to 30 s) get a moment to finish;
    # then the lifespan stops the trainer and the engines.
    if not settings.debug:  # a failed start is the one line below, not the lifespan's traceback in uvicorn's log
        logging.getLogger("uvicorn.error").addFilter(_no_startup_traceback)
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, timeout_keep_alive=75,
                    timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    except SystemExit:  # uvicorn's exit when the lifespan's start failed (status 3), or it could not bind
        error = getattr(app.state, "startup_error", None)
        if error is None:
            raise
        return refuse("tx serve", error, settings.debug)
    return 0


def _no_startup_traceback(record: logging.LogRecord) -> bool:
    """uvicorn logs a failed lifespan start as the formatted traceback the app sent (`lifespan.startup.failed`)."""
    return not str(record.msg).startswith("Traceback (most recent call last)")


def _check_vllm(settings: Settings, models: dict[str, Path]) -> None:
    """vLLM is installed where tx looks for it, and serves each model's family."""
    from tx.api.startup import StartupRefused
    from tx.inference.engines.vllm import VllmUnavailable, require_vllm
    from tx.inference.engines.vllm.support import VllmCannotServe, check_servable

    try:
        require_vllm(settings.engines.vllm_python)
        check_servable(models, settings.engines.vllm_python)
    except (VllmUnavailable, VllmCannotServe) as exc:
        raise StartupRefused(str(exc)) from exc


def engine_serve(args: argparse.Namespace) -> int:
    from tx.cpu import use_cpu_defaults

    use_cpu_defaults()
    from tx.api.startup import StartupRefused, check_port_free
    from tx.inference.engines.standalone import StandaloneEngine, StandaloneError, vllm_serve_command
    from tx.inference.engines.standalone import serve as serve_engine
    from tx.types import NotFoundError

    options = {k: v for k, v in vars(args).items()
               if k not in ("command", "engine_command", "print_vllm_command", "debug")}
    try:
        if args.print_vllm_command:
            print(vllm_serve_command(StandaloneEngine(**{**options, "kind": "vllm"})))
            return 0
        if args.vllm_url is None:
            check_port_free(args.host, args.port, "--port")
        serve_engine(StandaloneEngine(**options))
    except (StandaloneError, NotFoundError, ValidationError, StartupRefused) as exc:
        return refuse("tx engine serve", exc, args.debug)
    return 0


def make_tiny(args: argparse.Namespace) -> int:
    from tx.models import preset_for_name, write_tiny_model, write_to_hf_cache

    try:
        preset = args.preset or preset_for_name(args.name)
        if args.out is not None:
            path = write_tiny_model(args.out, preset=preset, seed=args.seed)
        else:
            hf_home = args.hf_home or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
            path = write_to_hf_cache(args.name, hf_home, preset=preset, seed=args.seed)
    except ValueError as exc:
        return refuse("tx models make-tiny", exc, args.debug)
    except OSError as exc:
        refusal = OSError(f"cannot write {exc.filename or args.out or args.hf_home} ({exc.strerror or exc}): choose "
                          "another place with --hf-home (or HF_HOME) or --out")
        refusal.__cause__ = exc
        return refuse("tx models make-tiny", refusal, args.debug)
    print(path)
    return 0


def export_checkpoint(args: argparse.Namespace) -> int:
    from tx.backends.torch.export import checkpoint_base_model, merge_into_base
    from tx.config import Settings
    from tx.core.checkpoints.files import CheckpointFiles, TinkerPath
    from tx.models.serve import resolve_served_models
    from tx.types import NotFoundError, UserError

    try:
        settings = Settings(**{k: v for k, v in vars(args).items() if k in ("data_dir", "base_models") and v})
        if args.path.startswith("tinker://"):
            directory = CheckpointFiles(settings.checkpoints_dir).require(TinkerPath.parse(args.path))
        else:
            directory = Path(args.path)
        base = checkpoint_base_model(directory)
        models = resolve_served_models(settings)
        if base not in models:
            raise UserError(f"base model {base!r} is not among {sorted(models)}; pass it with --base-model")
        print(merge_into_base(directory, models[base], args.merge))
    except (UserError, NotFoundError, OSError, ValidationError) as exc:
        return refuse("tx checkpoints export", exc, args.debug)
    return 0


def import_checkpoint(args: argparse.Namespace) -> int:
    from tx.client_commands import import_adapter

    return _on_server("import", lambda: print(import_adapter(args.directory, args.base_model, args.name,
                                                               args.project_id, args.url)))


def merge_checkpoint(args: argparse.Namespace) -> int:
    from tx.client_commands import merge_checkpoint as merge_on_server

    def merge() -> None:
        path, size = merge_on_server(args.path, args.name, args.ttl_s, args.url)
        print(path)
        print(f"({size / 2**20:,.1f} MiB; download it with: tinker checkpoint download {path})", file=sys.stderr)

    return _on_server("merge", merge)


def prune_checkpoints(args: argparse.Namespace) -> int:
    from tx.client_commands import ask, prune

    return _on_server("prune", lambda: prune(args.runs or [], args.older_than, args.kinds or [], args.yes, args.url,
                                             ask))


def _on_server(command: str, action: Callable[[], object]) -> int:
    """Run a `tx checkpoints` command that talks to a server: status 2 and one line for a refusal or a failed
    connection."""
    import httpx

    from tx.types import UserError

    try:
        action()
    except (UserError, OSError, httpx.HTTPError) as exc:
        print(f"tx checkpoints {command}: {exc}", file=sys.stderr)
        return 2
    return 0


CHECKPOINT_COMMANDS = {"export": export_checkpoint, "import": import_checkpoint, "merge": merge_checkpoint,
                       "prune": prune_checkpoints}


def main(argv: list[str] | None = None) -> int:
    from tx.logging import init_logging

    init_logging()
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "checkpoints":
        return CHECKPOINT_COMMANDS[args.checkpoints_command](args)
    if args.command == "engine":
        return engine_serve(args)
    return make_tiny(args)


if __name__ == "__main__":
    sys.exit(main())

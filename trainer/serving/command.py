"""`python -m trainer serve MODEL`: a model version served on this machine with an OpenAI-compatible API until
SIGINT or SIGTERM (`make serve MODEL=<tag or version>`, docs/serving.md).

    serve MODEL [--dir runs] [--host 127.0.0.1] [--port 8000] [--dtype fp32]
    serve --export DIR [--host 127.0.0.1] [--port 8000]

MODEL is a version's name, a tag (`models promote`), or `newest` (trainer/models/registry.py). The version's
export is RUN/export/<version> (`finetune-stages` writes it there, with RUN/export/<version>.export.json beside
it); where it is missing, it is made first (`convert --to-hf`, in --dtype), once. The API's model name is the
version's. `--export DIR` serves a Hugging Face export directory as it is (config.json, safetensors, the tokenizer
with its chat template, generation_config.json), named by the directory. Everything is checked before the model
loads: the version, its export or its checkpoint, the address.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from trainer.checkpoint.version import RecordError
from trainer.models.command import DEFAULT_DIR
from trainer.models.pipeline import CHECKPOINTS, DTYPES, EXPORT, export, marker_path
from trainer.models.registry import LocalStore, Registry

DEFAULT_PORT = 8000
# The label a local server's metrics carry as job_id (trainer/contract/metrics.py SERVING_LABELS).
LOCAL_JOB = "local"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", help="a model version's name, a tag (e.g. production), or newest")
    parser.add_argument(
        "--export",
        type=Path,
        help="serve this Hugging Face export directory instead of a version (named by it)",
    )
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help="the directory of run checkpoints (default runs/)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port (default {DEFAULT_PORT})")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="fp32",
        help="the export's dtype where it has to be made (default fp32: a CPU's, and generate's on a CPU run)",
    )


class ServeError(ValueError):
    """A server that cannot start: the model, its export or the address."""


def export_directory(registry: Registry, name: str) -> Path:
    """Where the version `name` names has (or will have) its export: RUN/export/<version>."""
    found = registry.find(name)
    checkpoint = Path(found.location)
    if checkpoint.parent.name != CHECKPOINTS:
        raise ServeError(f"{found.location}: not under a run's {CHECKPOINTS}/, so it has no RUN/{EXPORT}/")
    return checkpoint.parent.parent / EXPORT / found.record.version


def check_address(host: str, port: int) -> None:
    if not 0 < port < 65536:
        raise ServeError(f"--port {port}: give a port from 1 to 65535")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ServeError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None


def export_to_serve(args: argparse.Namespace) -> tuple[Path, str]:
    """The export directory to serve and its run's name: --export as given, or the version MODEL names (exported
    first where its export is missing)."""
    if args.export is not None:
        if args.model is not None:
            raise ServeError(f"give a model version ({args.model!r}) or --export, not both")
        missing = [
            name for name in ("config.json", "generation_config.json") if not (args.export / name).is_file()
        ]
        if missing:
            raise ServeError(f"--export {args.export}: not a Hugging Face export (no {', '.join(missing)})")
        return args.export.resolve(), args.export.resolve().name
    if args.model is None:
        raise ServeError("give a model version, a tag or newest (or --export DIR)")
    registry = Registry(LocalStore(args.dir))
    out = export_directory(registry, args.model)
    version = out.name
    if not marker_path(out.parent, version).is_file():
        print(
            f"serve: no complete export of {version} at {out}; exporting it ({args.dtype})", file=sys.stderr
        )
        if export(registry, version, out.parent, args.dtype) != 0:
            raise ServeError(f"the export of {version} failed (above)")
    return out, registry.find(version).record.run


def main(args: argparse.Namespace) -> int:
    try:
        check_address(args.host, args.port)
        out, run = export_to_serve(args)
        import fastapi  # noqa: F401 - the server's dependencies, before the model loads
        import uvicorn
    except ImportError as error:
        print(f"serve: {error.name} is missing: make venv installs requirements/dev.txt", file=sys.stderr)
        return 2
    except (ValueError, RecordError) as error:
        print(f"serve: {error}", file=sys.stderr)
        return 2
    from trainer.serving.app import build

    app = build(out, {"run": run, "job_id": LOCAL_JOB})
    print(
        f"serve: {out.name} on http://{args.host}:{args.port}/v1 (model={out.name!r}); metrics at /metrics",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0

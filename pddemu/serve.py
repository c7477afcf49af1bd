"""`pddemu serve`: bring up one emulated system and expose its frontend's OpenAI-compatible API.

    pddemu serve [--config configs/serve.toml] [--system pdd|naive|indc]

Prints one JSON line when ready: {"ready": true, "base_url": "http://198.18.x.y:PORT/v1", ...};
point any OpenAI client or benchmark tool at base_url (model "pddemu"). Runs until SIGINT or
SIGTERM, then removes everything it made. Needs root: the host's clients must reach the
emulated datacenter, which a private user namespace (`pddemu emulate`'s way without root) hides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

import uvloop

from netem.topology import LinkConfig, Network
from pddemu.config import SYSTEMS, load_config
from pddemu.deployment import Deployment
from pddemu.emulated_network import intra_link, scale_model, wan_link
from pddemu.roles.openai_api import MODEL_NAME

SERVE_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "serve.toml"


async def serve(deployment: Deployment, stop: asyncio.Event) -> None:
    await deployment.start()
    try:
        print(
            json.dumps(
                {
                    "ready": True,
                    "base_url": deployment.frontend_url + "/v1",
                    "model": MODEL_NAME,
                    "system": deployment.system,
                    "netns": deployment.network.a.netns,
                }
            ),
            flush=True,
        )
        await stop.wait()
    finally:
        await deployment.stop()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="an OpenAI-compatible endpoint on an emulated system",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, default=SERVE_CONFIG)
    parser.add_argument("--system", choices=SYSTEMS, default="pdd")
    parser.add_argument(
        "--run-dir", type=Path, default=Path("runs/serve"), help="logs and instance specs"
    )
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    scale = scale_model(config)
    with Network(
        LinkConfig.symmetric(wan_link(config, scale)), intra=intra_link(config, scale)
    ) as network:
        loop = uvloop.new_event_loop()
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        deployment = Deployment(args.system, config, network, args.run_dir, time.monotonic())
        try:
            loop.run_until_complete(serve(deployment, stop))
        finally:
            loop.close()
    return 0

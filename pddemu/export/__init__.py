"""`pddemu export`: a finished run's results in the formats other tools read.

    pddemu export RUN_DIR --format vllm|aiperf|perfetto [--system S] --out F

- vllm: the result JSON of `vllm bench serve --save-result --save-detailed` (one system);
- aiperf: AIPerf's profile export directory (F is the directory: profile_export_aiperf.json and
  profile_export.jsonl; one system);
- perfetto: a Chrome / Perfetto trace-event JSON timeline (every system, or the one named).
Times are the emulator's modelled time throughout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pddemu.config import SYSTEMS
from pddemu.help_format import HelpFormatter

FORMATS = ("vllm", "aiperf", "perfetto")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="a run's results as vLLM or AIPerf result files, or a Perfetto timeline",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a pddemu emulate --out")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        required=True,
        help="vllm or aiperf: their result files; perfetto: a timeline",
    )
    parser.add_argument(
        "--system",
        choices=SYSTEMS,
        help="the system to export (needed for vllm and aiperf when the run has several)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="file to write (aiperf: a directory)"
    )
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from pddemu.export.aiperf import write_aiperf
    from pddemu.export.perfetto import perfetto_trace
    from pddemu.export.run import read_run
    from pddemu.export.vllm import vllm_result

    runs = read_run(args.run_dir, args.system, allow_all=args.format == "perfetto")
    if args.format == "aiperf":
        written = write_aiperf(runs[0], args.out)
    else:
        document = vllm_result(runs[0]) if args.format == "vllm" else perfetto_trace(runs)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, allow_nan=False) + "\n")
        written = [args.out]
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0

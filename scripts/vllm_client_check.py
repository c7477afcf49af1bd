"""vLLM's benchmark request function against `pddemu serve` (run by scripts/vllm-client-check).

1. serve as configured (configs/serve.toml): 16 streamed completions, 4 at a time, 300-byte
   prompts, 48 output tokens each; every one must succeed with 48 completion tokens.
2. serve with a 1 s request timeout and 2000-token outputs: each request streams tokens, then
   fails midway; vLLM's client must count every one as failed.

    python vllm_client_check.py WHEEL WORK_DIR
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
MODULE = "vllm/benchmarks/lib/endpoint_request_func.py"


def vllm_request_functions(wheel: str) -> types.ModuleType:
    """The module alone, from the wheel (importing the vllm package would need its torch)."""
    module = types.ModuleType("endpoint_request_func")
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    exec(compile(zipfile.ZipFile(wheel).read(MODULE), MODULE, "exec"), module.__dict__)
    return module


def serve(work: Path, config: Path | None) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    command = [str(ROOT / ".venv/bin/pddemu"), "serve", "--port", "0", "--run-dir", str(work)]
    if config is not None:
        command += ["--config", str(config)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    return process, json.loads(process.stdout.readline())


async def bench(vllm: types.ModuleType, base_url: str, requests: int, output_len: int) -> list:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base_url}/v1/models") as response:
            model = (await response.json())["data"][0]["root"]
        slots = asyncio.Semaphore(4)

        async def one(i: int) -> Any:
            async with slots:
                given = vllm.RequestFuncInput(
                    prompt=f"{i:03d}" + "x" * 297,
                    api_url=base_url + "/v1/completions",
                    prompt_len=300,
                    output_len=output_len,
                    model=model,
                )
                return await vllm.async_request_openai_completions(given, session)

        return await asyncio.gather(*(one(i) for i in range(requests)))


def run(vllm: types.ModuleType, work: Path, config: Path | None, n: int, out: int) -> list:
    process, ready = serve(work, config)
    try:
        return asyncio.run(bench(vllm, ready["url"], n, out))
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(60)


def main() -> int:
    vllm = vllm_request_functions(sys.argv[1])
    work = Path(sys.argv[2])
    outputs = run(vllm, work / "run", None, 16, 48)
    good = [o for o in outputs if o.success and o.output_tokens == 48]
    print(f"served: {len(good)} of {len(outputs)} succeeded with 48 completion tokens")
    config = work / "short-timeout.toml"
    config.write_text("request_timeout_s = 1.0\n" + (ROOT / "configs/serve.toml").read_text())
    failing = run(vllm, work / "run-timeout", config, 4, 2000)
    counted = [o for o in failing if not o.success and o.ttft > 0]
    print(f"failing midway: {len(counted)} of {len(failing)} streamed tokens, counted as failed")
    return 0 if len(good) == len(outputs) and len(counted) == len(failing) else 1


if __name__ == "__main__":
    sys.exit(main())

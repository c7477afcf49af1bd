"""The README's AIPerf and vLLM command lines are the ones the benchmarks run (pddemu.bench's
aiperf and vllm_serve), so the figures beside them are those commands' figures."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from pddemu.bench.aiperf import aiperf_command
from pddemu.bench.vllm_serve import vllm_command

ROOT = Path(__file__).resolve().parents[1]
# serve's ready line as the README shows it, and the tokenizer as the README's commands give it
READY = {
    "url": "http://127.0.0.1:8000",
    "model": "pddemu",
    "tokenizer": "$(pwd)/pddemu/tokenizer",
}
# where a run writes its results and how it shows progress: a user picks these, they change no
# figure
WHERE_AND_HOW_SHOWN = {"--artifact-dir", "--export-level", "--ui-type", "--result-dir",
                       "--result-filename"}  # fmt: skip


def readme_command(program: str) -> list[str]:
    """The README's shell block line starting with `program`, its continuations joined."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"^{re.escape(program)} .*?(?<!\\)$", text, re.M | re.S)
    assert match, f"README shows no `{program}` command line"
    return shlex.split(match.group(0).replace("\\\n", " "))


def options(command: list[str], leading_words: int) -> dict[str, str | None]:
    """`--flag value` and bare `--flag` options of a command after its program and sub-command."""
    words = command[leading_words:]
    found: dict[str, str | None] = {}
    for i, word in enumerate(words):
        assert word.startswith("--") or (i and words[i - 1].startswith("--")), word
        if word.startswith("--"):
            valued = i + 1 < len(words) and not words[i + 1].startswith("--")
            found[word] = words[i + 1] if valued else None
    return {flag: value for flag, value in found.items() if flag not in WHERE_AND_HOW_SHOWN}


def test_the_readme_aiperf_command_is_the_benchmarks() -> None:
    readme = options(readme_command("aiperf profile"), 2)
    bench = options(aiperf_command(Path("aiperf"), READY, Path("artifacts")), 2)
    assert readme == bench


def test_the_readme_vllm_command_is_the_benchmarks() -> None:
    readme = options(readme_command("vllm bench serve"), 3)
    bench = options(vllm_command(Path("vllm"), READY, Path("results")), 3)
    assert readme == bench

"""The model's byte tokenizer as a Hugging Face tokenizer directory, for benchmark clients.

AIPerf and `vllm bench serve` count tokens with a Hugging Face tokenizer (`--tokenizer DIR`,
read by `transformers.AutoTokenizer`). The one shipped in `pddemu/tokenizer/` is the same
mapping as `pddemu.model.ByteTokenizer`: ids 0-255 are the UTF-8 bytes, 256 is BOS (added in
front when special tokens are asked for, as the server does), 257 is EOS. It is a byte-level
BPE without merges: each byte becomes GPT-2's printable stand-in character for it, and the
vocabulary maps that character to the byte's value.

    pddemu tokenizer export DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from pddemu.help_format import HelpFormatter
from pddemu.model.tokenizer import BOS_ID, BYTE_IDS, EOS_ID

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
MAX_LENGTH = 1 << 20  # no limit of its own: `[serve] max_prompt_tokens` is the server's
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def byte_characters() -> list[str]:
    """The printable character standing for each byte (GPT-2's byte-level alphabet): printable
    Latin-1 bytes stand for themselves, the others are moved to code points from 256 up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = 0
    characters = []
    for byte in range(BYTE_IDS):
        if byte in printable:
            characters.append(chr(byte))
        else:
            characters.append(chr(256 + shifted))
            shifted += 1
    return characters


def _added(token_id: int, content: str) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _byte_level() -> dict[str, Any]:
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }


def tokenizer_files() -> dict[str, str]:
    """File name -> content of the tokenizer directory."""
    bos = {"SpecialToken": {"id": BOS_TOKEN, "type_id": 0}}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(BOS_ID, BOS_TOKEN), _added(EOS_ID, EOS_TOKEN)],
        "normalizer": None,
        "pre_tokenizer": _byte_level(),
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [
                bos,
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {
                BOS_TOKEN: {"id": BOS_TOKEN, "ids": [BOS_ID], "tokens": [BOS_TOKEN]}
            },
        },
        "decoder": _byte_level(),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {char: byte for byte, char in enumerate(byte_characters())},
            "merges": [],
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "model_max_length": MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": True,  # "<|bos|>" in a prompt is text, as for ByteTokenizer
        "added_tokens_decoder": {
            str(i): {k: v for k, v in _added(i, t).items() if k != "id"}
            for i, t in ((BOS_ID, BOS_TOKEN), (EOS_ID, EOS_TOKEN))
        },
    }
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN}
    dump = {"ensure_ascii": False, "indent": 1}
    return {
        "tokenizer.json": json.dumps(tokenizer, **dump) + "\n",
        "tokenizer_config.json": json.dumps(config, **dump) + "\n",
        "special_tokens_map.json": json.dumps(special, **dump) + "\n",
    }


def shipped_directory() -> Path:
    """The tokenizer directory inside the installed package."""
    return Path(str(resources.files("pddemu") / "tokenizer"))


def export(directory: Path) -> list[Path]:
    """Copy the shipped tokenizer into `directory` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in FILES:
        shutil.copyfile(shipped_directory() / name, directory / name)
        written.append(directory / name)
    return written


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tokenizer",
        help="the model's tokenizer as a Hugging Face tokenizer directory (for AIPerf, vLLM)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="tokenizer_command", required=True)
    export_parser = sub.add_parser(
        "export",
        help="write the tokenizer directory (pass it to a client's --tokenizer)",
        description="Write the model's byte tokenizer as a Hugging Face tokenizer directory "
        "(tokenizer.json, tokenizer_config.json, special_tokens_map.json), for a benchmark "
        "client's --tokenizer (AIPerf, vllm bench serve). `pddemu serve` prints the directory "
        "shipped in the package as `tokenizer`; this writes a copy.",
    )
    export_parser.add_argument(
        "directory", type=Path, metavar="DIR", help="the directory to write (made if missing)"
    )
    export_parser.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    written = export(args.directory)
    print(f"wrote {', '.join(p.name for p in written)} in {args.directory}/")
    return 0


if __name__ == "__main__":  # regenerate the shipped directory from this module
    target = Path(__file__).resolve().parent / "tokenizer"
    target.mkdir(exist_ok=True)
    for file_name, content in tokenizer_files().items():
        (target / file_name).write_text(content)

"""`pddemu config docs|show`: docs/config.md written from the config schema (so the page can
never drift from what the loader accepts), and the checked config of a scenario as JSON.

    pddemu config docs [--out docs/config.md]
    pddemu config show [--config FILE] [--set SECTION.KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from pddemu.config import Config, Section, Unit, config_to_json, load_config
from pddemu.help_format import HelpFormatter

DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "config.md"

INTRO = """\
# Configuration

<!-- Generated from the schema in pddemu/config.py by `pddemu config docs --out docs/config.md`;
edit the schema's descriptions, not this page (a test checks that the two agree). -->

A scenario is one TOML file; `configs/default.toml` writes out the built-in defaults and is used
when `--config` is not given. Every key and every table is optional: a file names only what it
changes (a file holding only `[scale]` is a complete scenario). Values are checked when the file
is read; an unknown key, a wrong type, a value out of range or a word that is not one of the
allowed ones is refused in one line naming the file, the key and the reason, e.g.

    pddemu: configs/default.toml + policy.routing=bogus: policy.routing: must be one of
    'wan-time', 'always-relay' or 'never-relay', got 'bogus'

`pddemu emulate --set SECTION.KEY=VALUE` changes one value (TOML syntax; a bare word is a
string); `pddemu config show [--config F] [--set ...]` prints the checked result as JSON, in
base units (bit/s, seconds, probabilities). Quantities with units use netem's syntax (`10gbit`,
`20ms`, `0.5%`).
"""


def _nested(annotation: Any) -> type[Section] | None:
    """The section model of an optional table inside a section ([wan.cross_traffic])."""
    for arg in get_args(annotation):
        if isinstance(arg, type) and issubclass(arg, Section):
            return arg
    return None


def _type_text(annotation: Any) -> str:
    if _nested(annotation) is not None:
        return "table (below)"
    if get_origin(annotation) is dict:
        return "table"
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{choice}`" for choice in get_args(annotation))
    names = {int: "integer", float: "number", bool: "true or false", str: "string"}
    parts = [names.get(arg, getattr(arg, "__name__", str(arg))) for arg in get_args(annotation)]
    if parts:
        return " or ".join(p for p in parts if p != "NoneType")
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _allowed(field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "allowed" in extra:
        return str(extra["allowed"])
    unit = next((m for m in field.metadata if isinstance(m, Unit)), None)
    text = unit.example if unit else _type_text(field.annotation)
    bounds = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    limits = [
        f"{sign} {getattr(m, key):g}"
        for m in field.metadata
        for key, sign in bounds.items()
        if getattr(m, key, None) is not None
    ]
    return text + (f", {' and '.join(limits)}" if limits and not unit else "")


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    unit = next((m for m in field.metadata if isinstance(m, Unit)), None)
    if value is None:
        return "(none)"
    if unit is not None:
        return f'`"{unit.show(value)}"`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict):
        return "(see below)" if value else "(empty)"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def _row(key: str, field: FieldInfo) -> str:
    return f"| `{key}` | {_default(field)} | {_allowed(field)} | {field.description or ''} |"


def _table(model: type[Section]) -> list[str]:
    lines = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        lines.append(_row(field.alias or name, field))
    return lines


def _section(name: str, model: type[Section], note: str = "") -> list[str]:
    doc = inspect.cleandoc(model.__doc__ or "")
    title, _, rest = doc.partition("\n")
    lines = [f"## `[{name}]`: {title.rstrip('.')}", ""]
    if rest.strip():
        lines += [rest.strip(), ""]
    if note:
        lines += [note, ""]
    lines += [*_table(model), ""]
    for key, field in model.model_fields.items():
        nested = _nested(field.annotation)
        if nested is not None:
            lines += _section(f"{name}.{field.alias or key}", nested)
    return lines


def _sentence(text: str | None) -> str:
    return (text or "")[:1].upper() + (text or "")[1:]


def _dict_tables() -> list[str]:
    fields = Config.model_fields
    hardware = Config.model_fields["hardware"].get_default(call_default_factory=True)
    systems = Config.model_fields["systems"].get_default(call_default_factory=True)
    hardware_defaults = ", ".join(f"{role}: `{hw.chip}`" for role, hw in hardware.items())
    system_defaults = "; ".join(
        f"{system}: " + ", ".join(f"{role} {n}" for role, n in roles.items())
        for system, roles in systems.items()
    )
    from pddemu.config import InstanceHardwareConfig

    return [
        "## `[hardware.<role>]`: " + (InstanceHardwareConfig.__doc__ or "").strip().rstrip("."),
        "",
        _sentence(fields["hardware"].description) + f". Default chips: {hardware_defaults}.",
        "",
        *_table(InstanceHardwareConfig),
        "",
        "## `[systems.<system>]`: instances of each role",
        "",
        _sentence(fields["systems"].description)
        + f". Defaults: {system_defaults}. Counts are integers ≥ 0; each system needs at "
        "least one of each role it uses (pdd: P, RLD, MD; naive: P, MD; indc: P, D).",
        "",
    ]


def render() -> str:
    """The whole of docs/config.md."""
    top = ["## Top-level keys", "", "| key | default | allowed | meaning |", "|---|---|---|---|"]
    sections: list[str] = []
    for name, field in Config.model_fields.items():
        annotation = field.annotation
        if name == "source":
            continue
        if isinstance(annotation, type) and issubclass(annotation, Section):
            sections += _section(name, annotation)
        elif name in ("hardware", "systems"):
            if name == "hardware":
                sections += _dict_tables()
        else:
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            key = str(extra.get("file_key", name))
            top.append(_row(key, field))
    return "\n".join([INTRO, *top, "", *sections]).rstrip() + "\n"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config",
        help="the configuration's reference page, or a scenario checked",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="config_command", required=True)
    docs = sub.add_parser("docs", help="write the configuration reference (docs/config.md)")
    docs.add_argument("--out", type=Path, help="file to write (default: standard output)")
    docs.set_defaults(func=run_docs)
    show = sub.add_parser("show", help="check a scenario and print it as JSON, in base units")
    show.add_argument("--config", type=Path, help="TOML scenario (default: configs/default.toml)")
    show.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one value, as for pddemu emulate (repeatable)",
    )
    show.set_defaults(func=run_show)


def run_docs(args: argparse.Namespace) -> int:
    page = render()
    if args.out is None:
        sys.stdout.write(page)
    else:
        args.out.write_text(page)
    return 0


def run_show(args: argparse.Namespace) -> int:
    print(json.dumps(config_to_json(load_config(args.config, args.set)), indent=2))
    return 0

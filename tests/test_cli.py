"""`pddemu`'s entry: privileges are settled before anything else, and only when needed; every
argument's `--help` line says what it is for, and every help fits a terminal of 80 columns."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys

import pytest

import netem.rootless
from pddemu.cli import build_parser, main


def refuse(force: bool = False) -> None:
    raise AssertionError("must not enter a user namespace here")


def test_help_never_enters_a_user_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netem.rootless, "ensure_network_privileges", refuse)
    with pytest.raises(SystemExit) as done:
        main(["emulate", "--help"])
    assert done.value.code == 0


def test_serve_on_a_busy_port_says_so_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(netem.rootless, "ensure_network_privileges", refuse)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err


def test_an_abbreviated_rootless_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """`--rootless` is acted on by its full name before parsing; an abbreviation must not pass
    silently as root while the run stays on the host."""
    with pytest.raises(SystemExit) as done:
        main(["emulate", "--rootl", "--out", "unused"])
    assert done.value.code == 2 and "--rootl" in capsys.readouterr().err


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_serve_refuses_a_port_outside_tcps_range(
    port: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """70000 must not wrap round to 4464, nor -1 end in a resolver's message."""
    monkeypatch.setattr(netem.rootless, "ensure_network_privileges", refuse)
    with pytest.raises(SystemExit) as done:
        main(["serve", "--port", port])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "argument --port" in err and "cannot listen" not in err


class CountedLauncher:
    """In place of the instances' launcher: how many were started and closed."""

    started = 0
    closed = 0

    def __init__(self) -> None:
        CountedLauncher.started += 1

    def close(self) -> None:
        CountedLauncher.closed += 1


@pytest.mark.parametrize(
    ("argv", "started"),
    [
        (["emulate", "--out", "unused"], 0),
        (["emulate", "--out", "unused", "--system", "all"], 0),
        (["emulate", "--system=all", "--out", "unused"], 0),
        (["emulate", "--out", "unused", "--one-at-a-time"], 1),
        (["emulate", "--out", "unused", "--system", "pdd"], 1),
        (["emulate", "--system=naive", "--out", "unused"], 1),
        (["validate", "--out", "unused"], 1),
    ],
)
def test_a_launcher_is_started_first_only_for_a_command_that_uses_it(
    argv: list[str], started: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Systems at once each start a launcher of their own: one started before the command's
    imports would be closed unused (seconds of a core importing torch for nothing)."""
    monkeypatch.setattr(netem.rootless, "ensure_network_privileges", lambda force=False: None)
    monkeypatch.setattr("pddemu.roles.launcher.Launcher", CountedLauncher)
    monkeypatch.setattr(CountedLauncher, "started", 0)
    monkeypatch.setattr(CountedLauncher, "closed", 0)
    handed = []
    monkeypatch.setattr(
        "pddemu.cli._run_command", lambda _argv, _listener, launcher: handed.append(launcher) or 0
    )
    assert main(argv) == 0
    assert CountedLauncher.started == CountedLauncher.closed == started
    assert (handed[0] is not None) == bool(started)


def _arguments(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.Action]]:
    """Every argument of `parser` and of its sub-commands, with the command that takes it."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _arguments(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction):
            found.append((path, action))
    return found


def test_every_argument_says_what_it_is_for() -> None:
    """`--help` is the user's reference: no option or operand left without a line of its own
    (a bare default in parentheses says what it is, not what it is for)."""
    bare = [
        f"{path} {'/'.join(action.option_strings) or action.dest}"
        for path, action in _arguments(build_parser(), "pddemu")
        if not action.help or action.help.startswith("(")
    ]
    assert not bare, f"arguments without a help text: {bare}"


def _commands(
    parser: argparse.ArgumentParser, path: str
) -> list[tuple[str, argparse.ArgumentParser]]:
    """`parser` and every sub-command's parser under it, by command line."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, f"{path} {name}")
    return found


def test_every_help_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pddemu --help` and every sub-command's, as printed on a terminal of 80 columns: no line
    longer than 79 (descriptions are module docstrings, written at 100)."""
    monkeypatch.setenv("COLUMNS", "80")
    long = [
        f"{path}: {line}"
        for path, parser in _commands(build_parser(), "pddemu")
        for line in parser.format_help().splitlines()
        if len(line) > 79
    ]
    assert not long, "help lines over 79 columns:\n" + "\n".join(long)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_output_piped_to_a_reader_that_left_ends_quietly(buffered: bool) -> None:
    """`pddemu config show | head`: once the reader has gone, pddemu stops with the status of
    a process SIGPIPE ended (141), not with a traceback of its print."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first line
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pddemu.cli", "config", "show"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.stderr == "" and done.returncode == 128 + signal.SIGPIPE

"""Each point records the code, pddemu version and host load it ran with, so a sweep resumed on
other code keeps every point's own commit, and the plot and the reproduction tables say when
the points of one figure ran on different code. The executor writes what a `pddemu emulate`
would (a summary.json) and takes the provenance from pddemu.sweep.provenance as a real run
does, with the commit set per run the way another checkout would give it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pddemu.sweep import provenance
from pddemu.sweep.driver import Sweep
from pddemu.sweep.executors import Job
from pddemu.sweep.grid import expand, parse_grid
from pddemu.sweep.plot import plot_sweep
from pddemu.sweep.progress import Progress
from pddemu.sweep.provenance import UNRECORDED, after_point, before_point, mixed_code_note
from pddemu.sweep.report import code_of, how_it_ran, measure

FIRST = {"commit": "1" * 40, "dirty": False}
SECOND = {"commit": "2" * 40, "dirty": True, "diff_sha256": "ab" * 32}


class StampingExecutor:
    """Runs the first `limit` jobs (then stops, as an interrupted sweep does), each by writing
    a summary.json and reporting the provenance taken around it."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.ran: list[str] = []

    def run(self, jobs: list[Job], done, tick) -> None:
        for job in jobs[: self.limit]:
            before = before_point()
            summary = {"system": job.point.system, "ttft_s": {"p99": 1.0 + len(self.ran)}}
            (job.out / "summary.json").write_text(
                json.dumps({"systems": {job.point.system: summary}})
            )
            self.ran.append(job.point.id)
            done(job, 0, 0.1, after_point(before))


def points():
    return expand(None, [], parse_grid(["wan.delay=5ms,50ms"]), 2, ["pdd"])


def run_on(out: Path, code: dict[str, Any], monkeypatch, limit: int | None = None) -> Sweep:
    monkeypatch.setattr(provenance, "code_version", lambda: dict(code))
    sweep = Sweep(out, StampingExecutor(limit), {"code": provenance.code_version()}, Progress())
    sweep.run(points())
    sweep.progress.close()
    return sweep


def read(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def test_a_sweep_resumed_on_other_code_keeps_each_points_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_on(tmp_path, FIRST, monkeypatch, limit=2)  # stopped after two of four points
    run_on(tmp_path, SECOND, monkeypatch)  # resumed on other (modified) code
    result = read(tmp_path)
    ran_on = [e["point"]["provenance"]["code"] for e in result["points"]]
    assert ran_on == [FIRST, FIRST, SECOND, SECOND]
    # the sweep-level field keeps its name and is the latest run's; point_codes lists both
    assert result["sweep"]["code"] == SECOND
    assert result["sweep"]["point_codes"] == [
        {"code": "1111111111", "points": 2},
        {"code": "2222222222+modified:abababab", "points": 2},
    ]
    for e in result["points"]:
        recorded = e["point"]["provenance"]
        assert len(recorded["load_before"]) == len(recorded["load_after"]) == 3
        assert recorded["pddemu_version"] == provenance.pddemu_version()
        assert recorded["host"] and recorded["cpus"] >= 1
    with open(tmp_path / "sweep.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["code"] for row in rows] == ["1111111111"] * 2 + [
        "2222222222+modified:abababab"
    ] * 2
    assert all(float(row["load_before"]) >= 0 for row in rows)

    note = "points ran on 2 code versions: 1111111111 (2 points), 2222222222+modified:abababab"
    assert mixed_code_note(result["points"]).startswith(note)
    assert code_of(result["points"], result["sweep"]).startswith(note)
    # one delay's points ran on one code each: a figure of one of them is not mixed
    assert mixed_code_note(result["points"][:2]) is None
    assert code_of(result["points"][:2], result["sweep"]) == "code at 1111111111"


def test_the_plot_says_when_its_points_ran_on_different_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_on(tmp_path, FIRST, monkeypatch, limit=3)
    capsys.readouterr()  # the progress bar's
    plot_sweep(tmp_path, "wan.delay", "ttft_s.p99")
    assert capsys.readouterr().err == ""  # one code: nothing to say
    run_on(tmp_path, SECOND, monkeypatch)
    capsys.readouterr()
    plot_sweep(tmp_path, "wan.delay", "ttft_s.p99")
    assert "points ran on 2 code versions: 1111111111 (3 points)" in capsys.readouterr().err


def test_points_from_before_provenance_are_named_as_such(tmp_path: Path) -> None:
    """sweep.json files written before points recorded their code (docs/reproduction/): the
    tables fall back to the sweep's own field and say that it is the latest run's."""
    old = {"point": {"id": "a", "status": "done"}}
    new = {"point": {"id": "b", "status": "done", "provenance": {"code": FIRST}}}
    meta = {"code": SECOND}
    assert code_of([old, old], meta) == (
        "code at 2222222222+modified:abababab (the sweep's latest run; its points did not "
        "record their own)"
    )
    mixed = code_of([old, new], meta)
    assert mixed.startswith(f"points ran on 2 code versions: {UNRECORDED} (1 point), 1111111111")
    assert "latest run was at 2222222222" in mixed


def test_the_code_version_is_this_checkouts(tmp_path: Path) -> None:
    """Outside the test's monkeypatching: the commit git names for this checkout, and a digest
    of the modification only when tracked files differ from it."""
    version = provenance.code_version()
    here = Path(provenance.__file__).parent
    head = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        assert version is None
        return
    assert version["commit"] == head.stdout.strip()
    status = subprocess.run(
        ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version["dirty"] == bool(status.stdout.strip())
    assert ("diff_sha256" in version) == version["dirty"]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A checkout with a committed text file and a committed binary file."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.invalid")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "module.py").write_bytes(b"name = 'plain'\n")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_a_modification_in_latin1_is_read_as_bytes(repo: Path) -> None:
    clean = provenance.checkout_version(repo)
    assert clean is not None and clean["dirty"] is False and "diff_sha256" not in clean
    (repo / "module.py").write_bytes(b"name = 'caf\xe9'\n")  # not UTF-8
    modified = provenance.checkout_version(repo)
    assert modified["commit"] == clean["commit"] and modified["dirty"] is True
    assert len(modified["diff_sha256"]) == 64


def test_two_binary_changes_have_their_own_digests(repo: Path) -> None:
    digests = []
    for last in (b"\x01", b"\x02"):
        (repo / "blob.bin").write_bytes(bytes(range(255)) + last)
        digests.append(provenance.checkout_version(repo)["diff_sha256"])
    assert digests[0] != digests[1]


def test_an_external_diff_tool_does_not_change_the_digest(repo: Path) -> None:
    (repo / "module.py").write_bytes(b"name = 'changed'\n")
    plain = provenance.checkout_version(repo)
    git(repo, "config", "diff.external", "echo")  # prints its arguments: temp paths
    assert provenance.checkout_version(repo) == plain


@pytest.mark.parametrize(
    "setting",
    [
        ("diff.noprefix", "true"),
        ("color.diff", "always"),
        ("color.ui", "always"),
        ("diff.mnemonicPrefix", "true"),
        ("diff.context", "9"),
    ],
)
def test_the_users_diff_settings_do_not_change_the_digest(
    repo: Path, setting: tuple[str, str]
) -> None:
    """One change is one code version whoever's git config the point ran under."""
    lines = [f"line_{n} = {n}\n".encode() for n in range(20)]
    (repo / "module.py").write_bytes(b"".join(lines))
    git(repo, "commit", "-q", "-am", "longer")
    lines[10] = b"line_10 = 'changed'\n"  # a change with more lines around it than 3
    (repo / "module.py").write_bytes(b"".join(lines))
    plain = provenance.checkout_version(repo)
    git(repo, "config", *setting)
    assert provenance.checkout_version(repo) == plain


def test_a_touched_but_unchanged_file_is_not_a_modification(repo: Path) -> None:
    """diff-index compares the index's stat data: a file whose time alone changed adds no
    patch (git diff would refresh; diff-index names it without content)."""
    os.utime(repo / "module.py", (0, 0))
    assert provenance.checkout_version(repo)["dirty"] is False


def test_a_failing_git_diff_records_dirty_as_unknown(repo: Path) -> None:
    (repo / ".git" / "index").write_bytes(b"not an index")  # rev-parse works, diff fails
    version = provenance.checkout_version(repo)
    assert version["dirty"] is None and "diff_sha256" not in version
    assert provenance.code_label(version).endswith("+modified:unknown")


def test_a_resume_keeps_the_earlier_sweep_level_code_of_points_without_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Points finished before points recorded their code: a resume on other code overwrites
    the sweep-level field, so they take the earlier one first, marked as such, for good."""
    run_on(tmp_path, FIRST, monkeypatch, limit=2)
    for path in (tmp_path / "points").glob("*/point.json"):
        record = json.loads(path.read_text())
        del record["provenance"]  # as such a point was recorded
        path.write_text(json.dumps(record))
    earlier = {"code": FIRST, "from": "sweep-level code of an earlier run"}
    run_on(tmp_path, SECOND, monkeypatch)
    run_on(tmp_path, SECOND, monkeypatch)  # again: the stamp is kept, not SECOND's
    result = read(tmp_path)
    assert [e["point"]["provenance"] for e in result["points"][:2]] == [earlier, earlier]
    assert [e["point"]["provenance"]["code"] for e in result["points"][2:]] == [SECOND, SECOND]
    assert result["sweep"]["point_codes"][0] == {"code": "1111111111", "points": 2}


def test_a_value_over_seeds_on_different_code_is_given_per_seed(tmp_path: Path) -> None:
    def point(seed: int, code: dict[str, Any], share: float) -> dict[str, Any]:
        about = {"id": f"p{seed}", "status": "done", "provenance": {"code": code}}
        return {"settings": {}, "seed": seed, "system": "pdd", "point": about, "share": share}

    claim = {"kind": "value", "system": "pdd", "format": "percent"}
    mixed = [point(0, FIRST, 0.0), point(1, SECOND, 0.356)]
    assert measure(claim, {None: (mixed, {}, None)}, "share")[0] == (
        "0.0 % (seed 0 at 1111111111), 35.6 % (seed 1 at 2222222222+modified:abababab): "
        "no mean, the seeds ran on different code"
    )
    one = [point(0, FIRST, 0.0), point(1, FIRST, 0.356)]
    assert (
        measure(claim, {None: (one, {}, None)}, "share")[0] == "17.8 % (0.0 % to 35.6 %, 2 seeds)"
    )


def result(system: str, seed: int, code: dict[str, Any], rate: str | None = None, **fields):
    about = {"id": f"{system}{seed}{rate}", "status": "done", "provenance": {"code": code}}
    settings = {} if rate is None else {"workload.arrival_rate": rate}
    return {"settings": settings, "seed": seed, "system": system, "point": about, **fields}


def test_a_change_over_seeds_on_different_code_is_given_per_seed() -> None:
    claim = {"kind": "change", "system": "pdd", "versus": "naive"}
    naive = [result("naive", s, FIRST, share=0.5) for s in (0, 1)]
    mixed = [result("pdd", 0, FIRST, share=0.25), result("pdd", 1, SECOND, share=0.75), *naive]
    assert measure(claim, {None: (mixed, {}, None)}, "share")[0] == (
        "-50.0 % (seed 0 at 1111111111), +50.0 % (seed 1 at 2222222222+modified:abababab vs "
        "1111111111): no mean, the seeds ran on different code"
    )
    one = [result("pdd", 0, FIRST, share=0.25), result("pdd", 1, FIRST, share=0.75), *naive]
    assert (
        measure(claim, {None: (one, {}, None)}, "share")[0]
        == "+0.0 % (-50.0 % to +50.0 %, 2 seeds)"
    )


def test_a_search_change_over_seeds_on_different_code_is_given_per_seed() -> None:
    claim = {"kind": "search-change", "system": "pdd", "versus": "naive"}
    search = {
        "results": [{"system": "pdd", "arrival_rate": 2}, {"system": "naive", "arrival_rate": 1}]
    }
    naive = [result("naive", s, FIRST, "1", goodput=1.0) for s in (0, 1)]
    mixed = [result("pdd", 0, FIRST, "2", goodput=2.0), result("pdd", 1, SECOND, "2", goodput=3.0)]
    assert measure(claim, {None: ([*mixed, *naive], {}, search)}, "goodput")[0] == (
        "+100.0 % (seed 0 at 1111111111), +200.0 % (seed 1 at 2222222222+modified:abababab vs "
        "1111111111): no mean, the seeds ran on different code (max goodput at 2 vs 1 req/s)"
    )


def test_an_at_nearest_over_seeds_on_different_code_is_given_per_seed() -> None:
    claim = {
        "kind": "at-nearest",
        "system": "pdd",
        "key": "workload.arrival_rate",
        "find_system": "naive",
        "find_metric": "ttft",
        "target": 4.0,
        "format": "seconds",
    }

    def seed(number: int, code: dict[str, Any], near_fast: bool, p99: float) -> list[dict]:
        return [
            result("naive", number, code, "1.0", ttft=4.0 if near_fast else 1.0),
            result("naive", number, code, "2.0", ttft=9.0 if near_fast else 4.0),
            result("pdd", number, code, "1.0", p99=p99),
            result("pdd", number, code, "2.0", p99=2 * p99),
        ]

    mixed = [*seed(0, FIRST, True, 1.0), *seed(1, SECOND, False, 3.0)]
    assert measure(claim, {None: (mixed, {}, None)}, "p99")[0] == (
        "1.00 s at workload.arrival_rate=1.0 (seed 0 at 1111111111), 6.00 s at "
        "workload.arrival_rate=2.0 (seed 1 at 2222222222+modified:abababab): no mean, the "
        "seeds ran on different code"
    )
    one = [*seed(0, FIRST, True, 1.0), *seed(1, FIRST, True, 3.0)]
    assert measure(claim, {None: (one, {}, None)}, "p99")[0].endswith(
        ": 2.00 s (1.00 s to 3.00 s, 2 seeds)"
    )


def test_a_sweep_with_no_finished_point_says_so() -> None:
    assert code_of([], {"code": FIRST}) == (
        "code at 1111111111 (the sweep's latest run; no point finished)"
    )


def test_commits_off_the_history_are_named_with_the_commit_of_their_code(tmp_path: Path) -> None:
    """A sweep run from a branch records the branch's commit, which its rebase leaves out of
    main's history: what main holds of the same code is named; a commit not in the
    repository at all is said to be so."""
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "config", "user.email", "t@example.invalid")
    git(tmp_path, "config", "user.name", "t")

    def commit(path: str, text: str) -> str:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        git(tmp_path, "add", ".")
        git(tmp_path, "commit", "-q", "-m", path)
        return subprocess.run(
            ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()

    commit("pddemu/roles.py", "first = 1\n")
    code = commit("pddemu/roles.py", "second = 2\n")
    git(tmp_path, "checkout", "-q", "-b", "branch")
    experiment_only = commit("experiments/e.toml", "seeds = 3\n")
    new_code = commit("pddemu/roles.py", "third = 3\n")
    git(tmp_path, "checkout", "-q", "main")
    docs = commit("docs/d.md", "after\n")
    absent = "f" * 40
    assert provenance.stray_commits(
        [code, docs, experiment_only, new_code, absent, experiment_only], tmp_path / "pddemu"
    ) == [
        f"{experiment_only[:10]} (not in this history; the same code as {code[:10]})",
        f"{new_code[:10]} (not in this history; its code is in none of it)",
        "ffffffffff (not a commit of this repository)",
    ]


def test_the_report_says_which_recorded_commits_the_checkout_does_not_hold() -> None:
    """Against this checkout: its HEAD is not named, a commit it has no object of is."""
    here = provenance.code_version()
    if here is None:
        pytest.skip("not a git checkout")
    absent = {"commit": "f" * 40, "dirty": False}
    entries = [result("pdd", 0, here), result("pdd", 1, absent)]
    line = how_it_ran("demo", entries, {"code": here})
    assert (
        "recorded commits this checkout's history does not hold: ffffffffff (not a commit" in line
    )
    assert line.count(here["commit"][:10]) == 1  # in the list of code versions only

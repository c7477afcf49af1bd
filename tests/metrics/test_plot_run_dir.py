"""`pddemu plot RUN_DIR`: a run directory's figures drawn again are the ones `pddemu emulate`
drew at the end of its run, pixel for pixel; a directory without what a figure needs is named."""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from metrics_samples import baseline_records, sample_instances, sample_records

from pddemu.cli import main
from pddemu.config import load_config
from pddemu.emulate import SystemRun, write_outputs
from pddemu.emulated_network import scale_model, wan_link
from pddemu.metrics.figure_inputs import wan_transfers
from pddemu.metrics.plots import PLOT_FILES

WARMUP = {"r1", "r2"}


def _transfer(rid: str, start: float, end: float) -> dict:
    chunks = [[start + (end - start) / 2, 600], [end, 400]]
    return {"kind": "kv_transfer", "rid": rid, "start_s": start, "end_s": end,
            "genuine_bytes": 1000, "chunks": chunks}  # fmt: skip


def emulated_run_dir(out: Path) -> Path:
    """A run directory as `pddemu emulate` leaves it (pdd with a warm-up, then indc): the
    files and figures `write_outputs` writes, and each system's instances-<system>.json."""
    config = load_config(
        None, ['workload.trace="synthetic"', "workload.requests=3", "workload.warmup_requests=2"]
    )
    scale = scale_model(config)
    stats = {
        "pdd": {
            "MD0": {
                "role": "MD",
                "events": [_transfer("r1", 0.1, 0.5), _transfer("r3", 2.1, 2.6)]
                + [_transfer("r5~1", 4.2, 4.4), _transfer("r4", 3.1, 3.1)],
            },
            "P0": {"role": "P", "events": [{**_transfer("r3", 2.0, 2.1), "kind": "prefill"}]},
        },
        "indc": {"D0": {"role": "D", "events": []}},
    }
    records = {
        "pdd": [replace(r, token_mismatch=False) for r in sample_records()],
        "indc": baseline_records("indc", 0.4),
    }
    runs = {}
    out.mkdir()
    for system in ("pdd", "indc"):
        (out / f"instances-{system}.json").write_text(json.dumps(stats[system]))
        runs[system] = SystemRun(
            system, records[system], {}, sample_instances(), 0,
            wan_transfers=wan_transfers(stats[system]),
        )  # fmt: skip
    write_outputs(config, scale, wan_link(config, scale), runs, [], out, WARMUP)
    return out


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return emulated_run_dir(tmp_path_factory.mktemp("emulated") / "run")


@pytest.fixture
def run_dir(emulated: Path, tmp_path: Path) -> Path:
    """The emulated run's directory, a copy of its own to change."""
    return Path(shutil.copytree(emulated, tmp_path / "run"))


def test_the_figures_drawn_again_are_the_ones_emulate_drew(run_dir: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert main(["plot", str(run_dir), "--out", str(again)]) == 0
    for name in PLOT_FILES.values():
        drawn, redrawn = imread(run_dir / name), imread(again / name)
        assert drawn.shape == redrawn.shape and np.array_equal(drawn, redrawn), name


def test_one_systems_figures_are_its_own(run_dir: Path, tmp_path: Path) -> None:
    pdd, indc = tmp_path / "pdd", tmp_path / "indc"
    assert main(["plot", str(run_dir), "--system", "pdd", "--out", str(pdd)]) == 0
    assert main(["plot", str(run_dir), "--system", "indc", "--out", str(indc)]) == 0
    assert np.array_equal(imread(pdd / "wan_use.png"), imread(run_dir / "wan_use.png"))
    assert not np.array_equal(imread(pdd / "ttft_cdf.png"), imread(run_dir / "ttft_cdf.png"))
    assert not np.array_equal(imread(indc / "ttft_cdf.png"), imread(pdd / "ttft_cdf.png"))


def _refused(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["plot", str(run_dir), "--out", str(run_dir.parent / "out")]) == 2
    return capsys.readouterr().err


def test_a_run_dir_without_what_a_figure_needs_is_named(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "instances-pdd.json").unlink()
    assert f"{run_dir}/instances-pdd.json is missing" in _refused(run_dir, capsys)
    (run_dir / "requests.csv").unlink()
    assert f"{run_dir}/requests.csv is missing" in _refused(run_dir, capsys)


def test_a_run_dir_without_its_warmups_ids_is_refused(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run written before the ids were kept: its warm-up would be drawn as measured."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(summary.pop("warmup_request_ids")) == sorted(WARMUP)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    error = _refused(run_dir, capsys)
    assert "summary.json has no warmup_request_ids" in error and "its 2 warm-up" in error
    del summary["systems"]["pdd"]["slo"]
    summary["warmup_requests"] = 0
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert "summary.json has no systems.pdd.slo: the figures need it" in _refused(run_dir, capsys)


def _gzip(path: Path) -> Path:
    """`path` replaced by its gzipped copy, as the reference runs are committed."""
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return packed


def test_a_run_dir_kept_gzipped_draws_the_same_figures(run_dir: Path, tmp_path: Path) -> None:
    for name in ("requests.csv", "instances-pdd.json", "instances-indc.json"):
        _gzip(run_dir / name)
    again = tmp_path / "again"
    assert main(["plot", str(run_dir), "--out", str(again)]) == 0
    for name in PLOT_FILES.values():
        assert np.array_equal(imread(run_dir / name), imread(again / name)), name


def test_a_gzipped_file_that_is_not_whole_is_named(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    packed = _gzip(run_dir / "requests.csv")
    whole = packed.read_bytes()
    packed.write_bytes(whole[:-100])
    assert f"{packed}: not a whole gzip file" in _refused(run_dir, capsys)
    packed.write_bytes(whole)
    (run_dir / "instances-pdd.json").unlink()
    (run_dir / "instances-pdd.json.gz").write_bytes(b"not gzip")
    assert f"{run_dir}/instances-pdd.json.gz: not a whole gzip file" in _refused(run_dir, capsys)


def _damaged(packed: bytes) -> bytes:
    """`packed` with its first deflate bytes, past gzip's 10-byte header, overwritten: an
    invalid block."""
    return packed[:10] + b"\xff" * 8 + packed[18:]


def test_a_gzipped_file_whose_data_does_not_decode_is_named(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A whole-looking gzip file whose deflate data is damaged (zlib.error), or whose text is
    not UTF-8, is named, not a traceback."""
    packed = _gzip(run_dir / "requests.csv")
    whole = packed.read_bytes()
    packed.write_bytes(_damaged(whole))
    assert f"{packed}: not a whole gzip file" in _refused(run_dir, capsys)
    packed.write_bytes(gzip.compress(b"\xff\xfe"))
    assert f"{packed}: not UTF-8 text" in _refused(run_dir, capsys)
    packed.write_bytes(whole)
    instances = _gzip(run_dir / "instances-pdd.json")
    instances.write_bytes(_damaged(instances.read_bytes()))
    assert f"{instances}: not a whole gzip file" in _refused(run_dir, capsys)
    instances.write_bytes(gzip.compress(b"\xff\xfe"))
    assert f"{instances}: not UTF-8 text" in _refused(run_dir, capsys)

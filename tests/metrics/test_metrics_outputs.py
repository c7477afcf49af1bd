"""requests.csv round trip, summary.json, the comparison table and report.md."""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path

import pytest
from metrics_samples import (
    SAMPLE_SCALE,
    SAMPLE_SLO,
    SAMPLE_WAN_RATE,
    baseline_records,
    sample_instances,
    sample_records,
)

from pddemu.metrics import (
    MetricsError,
    RequestRecord,
    format_markdown_table,
    format_table,
    read_requests_csv,
    summarize,
    write_report,
    write_requests_csv,
    write_summary_json,
)
from pddemu.metrics.outputs import REQUESTS_COLUMNS
from pddemu.metrics.report import bits_per_second
from pddemu.metrics.table import byte_count, number, percent, relative_change, seconds


def all_records() -> list[RequestRecord]:
    return sample_records() + baseline_records("naive", 2.0) + baseline_records("indc", 1.25)


def summaries() -> dict[str, dict]:
    by_system: dict[str, list[RequestRecord]] = {}
    for record in all_records():
        by_system.setdefault(record.system, []).append(record)
    return {
        system: summarize(
            system,
            records,
            sample_instances(),
            SAMPLE_SLO,
            SAMPLE_SCALE,
            None if system == "indc" else SAMPLE_WAN_RATE,
        )
        for system, records in by_system.items()
    }


def test_requests_csv_round_trip_with_the_csv_module(tmp_path: Path) -> None:
    records = all_records()
    path = write_requests_csv(tmp_path / "requests.csv", records)
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(records)
    assert tuple(rows[0]) == REQUESTS_COLUMNS
    for record, row in zip(records, rows, strict=True):
        for field in fields(RequestRecord):
            value, cell = getattr(record, field.name), row[field.name]
            if value is None:
                assert cell == "", field.name
            elif isinstance(value, list):
                assert ([float(t) for t in cell.split(";")] if cell else []) == value
            elif isinstance(value, bool):
                assert cell == str(value)
            elif isinstance(value, float):
                assert float(cell) == value, field.name  # repr: exact
            else:
                assert type(value)(cell) == value, field.name
        for derived in ("ttft_s", "tpot_s", "e2el_s"):
            expected = getattr(record, derived)
            assert (float(row[derived]) if row[derived] else None) == expected


def test_requests_csv_reads_back_equal_records(tmp_path: Path) -> None:
    records = all_records()
    records[0].token_times_s = [1.0 / 3, 0.1 + 0.2, 1e-9, 12345.678901234567]
    records[0].output_tokens = 4
    path = write_requests_csv(tmp_path / "requests.csv", records)
    assert read_requests_csv(path) == records


def test_requests_csv_of_no_records_is_a_header(tmp_path: Path) -> None:
    path = write_requests_csv(tmp_path / "requests.csv", [])
    assert path.read_text().strip().split(",") == list(REQUESTS_COLUMNS)
    assert read_requests_csv(path) == []


def test_requests_csv_reader_names_bad_cells(tmp_path: Path) -> None:
    path = write_requests_csv(tmp_path / "requests.csv", sample_records())
    text = path.read_text()
    (tmp_path / "bad_bool.csv").write_text(text.replace(",False,", ",maybe,", 1))
    with pytest.raises(MetricsError, match=r"bad_bool.csv:2: column \w+: expected True or False"):
        read_requests_csv(tmp_path / "bad_bool.csv")
    header, *rest = text.splitlines()
    (tmp_path / "no_state.csv").write_text("\n".join([header.replace("state,", "status,"), *rest]))
    with pytest.raises(MetricsError, match="header lacks column.s. state"):
        read_requests_csv(tmp_path / "no_state.csv")


def test_requests_csv_written_before_a_column_existed_reads_it_as_the_default(
    tmp_path: Path,
) -> None:
    """A requests.csv from before kv_first_chunk_s (6561da1) and failover_path (6582fbf):
    each reads as its field's default, the rest as written. On the code before, the reader
    refused it ("header lacks column(s) kv_first_chunk_s"), so `pddemu export` and `pddemu
    plot` of any older run directory failed."""
    records = sample_records()
    for record in records:
        record.kv_first_chunk_s, record.failover_path = 1.25, "0.50 s: routed again"
    path = write_requests_csv(tmp_path / "requests.csv", records)
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    older = [c for c in REQUESTS_COLUMNS if c not in ("kv_first_chunk_s", "failover_path")]
    with (tmp_path / "older.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, older, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    read = read_requests_csv(tmp_path / "older.csv")
    for record in records:
        record.kv_first_chunk_s, record.failover_path = None, ""
    assert read == records


def test_summary_json_holds_systems_and_meta(tmp_path: Path) -> None:
    data = summaries()
    path = write_summary_json(tmp_path / "summary.json", data, {"seed": 3, "trace": "t.jsonl"})
    loaded = json.loads(path.read_text())
    assert list(loaded["systems"]) == ["pdd", "naive", "indc"]
    assert loaded["systems"]["pdd"] == data["pdd"]
    assert loaded["seed"] == 3 and loaded["trace"] == "t.jsonl"


@pytest.mark.parametrize(
    ("summaries_", "meta", "message"),
    [
        ({}, {"systems": 1}, "must not have a 'systems' key"),
        ({"pdd": {"system": "naive"}}, {}, "summary under 'pdd' is for system 'naive'"),
        ({"pdd": {"system": "pdd", "x": float("nan")}}, {}, "not strict JSON"),
        ({"pdd": {"system": "pdd", "x": object()}}, {}, "not strict JSON"),
    ],
)
def test_summary_json_refuses_bad_documents(tmp_path, summaries_, meta, message) -> None:
    with pytest.raises(MetricsError, match=message):
        write_summary_json(tmp_path / "s.json", summaries_, meta)


def test_value_formats() -> None:
    assert [number(x) for x in (0, 0.000123, 0.5, 12.34, 1234.5, None)] == [
        "0",
        "0.000123",
        "0.500",
        "12.3",
        "1,234",
        "-",
    ]
    assert seconds(0.0425) == "42.5 ms" and seconds(2.5) == "2.50 s"
    assert byte_count(512) == "512 B" and byte_count(24_500) == "24.5 kB"
    assert byte_count(3.2e9) == "3.20 GB"
    assert percent(5 / 12) == "41.7%"
    assert relative_change(1.0, 2.0) == "-50.0%" and relative_change(3.0, 2.0) == "+50.0%"
    assert relative_change(1.0, 0.0) == "-" and relative_change(None, 1.0) == "-"
    assert bits_per_second(8e6) == "8.00 Mbit/s" and bits_per_second(None) == "no WAN"


def table_row(text: str, label: str) -> list[str]:
    (line,) = [line for line in text.splitlines() if line.startswith(label)]
    return line[len(label) :].split()


def test_text_table_puts_systems_side_by_side_with_relative_changes() -> None:
    text = format_table(summaries())
    header = text.splitlines()[0].split()
    assert header == ["metric", "pdd", "naive", "indc", "pdd", "vs", "naive", "pdd", "vs", "indc"]
    # pdd TTFT p50 1.0 s; naive 2.0 s; indc 1.25 s
    assert table_row(text, "TTFT p50") == [
        "1.00",
        "s",
        "2.00",
        "s",
        "1.25",
        "s",
        "-50.0%",
        "-20.0%",
    ]
    # goodput: pdd 3 / 6 s; naive 0 (TTFT 2.0 s misses 1.5 s); indc 2 / 2.45 s (first arrival
    # 0, last finish 1 + 1.25 + 0.2); BCR divides each by 27 per hour; pdd vs indc: 0.5 / (2 / 2.45)
    assert table_row(text, "BCR (goodput / cost per hour)") == [
        "0.0185",
        "0",
        "0.0302",
        "-",
        f"{(0.5 / (2 / 2.45) - 1) * 100:+.1f}%",
    ]
    assert table_row(text, "requests within SLO") == ["60.0%", "0.0%", "100.0%"]
    assert table_row(text, "pipelines P-MD / P-RLD-MD / RLD-only / P-D") == [
        "2",
        "/",
        "2",
        "/",
        "1",
        "/",
        "-",
        "0",
        "/",
        "0",
        "/",
        "0",
        "/",
        "2",
        "0",
        "/",
        "0",
        "/",
        "0",
        "/",
        "2",
    ]
    assert table_row(text, "WAN bytes sent") == ["24.5", "kB", "14.0", "kB", "14.0", "kB"]
    assert table_row(text, "max handoff stall") == ["2.00", "s", "-", "-"]
    assert table_row(text, "token mismatches") == ["1", "0", "0"]
    assert table_row(text, "cost per hour") == ["27.0", "27.0", "27.0"]
    for label in (
        "TPOT p99",
        "ITL p99",
        "E2EL p50",
        "RLD token share",
        "hit rate, MD side (mean)",
        "WAN bytes without DRC",
        "emulator lag p99",
        "handoffs one-shot / catch-up",
    ):
        assert table_row(text, label)


def test_table_says_what_the_clock_slowed_down_for_most() -> None:
    """The three most frequent causes of the clock's slow-downs (kind of lag or holds, and
    participant), the rest summed; "-" for a run that never slowed down."""
    data = summaries()
    slowed_by = {"hold RLD0": 4, "lag delivery FE0": 50, "lag handler P0": 2, "lag send x": 1}
    data["pdd"]["dilation"] = {"speedup": 0.35, "slowed_by": slowed_by}
    data["naive"]["dilation"] = {"speedup": 1.0, "slowed_by": {}}
    row = table_row(format_table(data), "clock slowed by (slow-downs)")
    assert " ".join(row) == "lag delivery FE0 50, hold RLD0 4, lag handler P0 2, others 1 - -"


def test_table_without_pdd_has_no_relative_columns() -> None:
    data = summaries()
    del data["pdd"]
    header = format_table(data).splitlines()[0].split()
    assert header == ["metric", "naive", "indc"]
    with pytest.raises(MetricsError, match="no system"):
        format_table({})


def test_table_names_a_missing_summary_field() -> None:
    data = summaries()
    del data["naive"]["ttft_s"]
    with pytest.raises(MetricsError, match="'naive' has no field 'ttft_s.p50'"):
        format_table(data)


def test_report_holds_table_scale_and_existing_figures(tmp_path: Path) -> None:
    out = tmp_path / "run"
    plots_dir = out / "figures"
    plots_dir.mkdir(parents=True)
    plot = plots_dir / "ttft.png"
    plot.write_bytes(b"\x89PNG\r\n\x1a\nfake but present")
    data = summaries()
    path = write_report(
        out, data, {"trace": "mooncake", "systems_run": ["pdd"]}, {"TTFT CDF": plot}
    )
    text = path.read_text()
    assert path == out / "report.md"
    assert format_markdown_table(data).strip() in text
    assert "| pdd | 0.0625 | 2 | 8.00 Mbit/s | 0.001 |" in text
    assert "| indc | 0.0625 | 2 | no WAN | 0.001 |" in text
    assert "SLO: TTFT at most 1.50 s, TPOT at most 500 ms." in text
    assert "- trace: mooncake" in text and '- systems_run: ["pdd"]' in text
    images = [line for line in text.splitlines() if line.startswith("![")]
    assert images == ["![TTFT CDF](figures/ttft.png)"]
    for image in images:
        assert (out / image.split("(")[1].rstrip(")")).is_file()
    assert "## How to read" in text


def test_report_refuses_a_missing_figure(tmp_path: Path) -> None:
    with pytest.raises(MetricsError, match="plot 'TTFT CDF'.*missing or empty"):
        write_report(tmp_path, summaries(), {}, {"TTFT CDF": tmp_path / "absent.png"})

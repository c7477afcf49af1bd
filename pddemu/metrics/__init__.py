"""Per-request records, the metrics computed from them, and the files a run writes.

A run hands each system's `RequestRecord`s and `InstanceReport`s to `summarize`, then writes
requests.csv, summary.json and report.md with the functions exported here. The figures are in
`pddemu.metrics.plots`, not imported here: matplotlib takes about half a second to import
(`python -X importtime`) and every emulated instance imports this package for its records.
"""

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.outputs import (
    REQUESTS_FILE,
    SUMMARY_FILE,
    read_requests_csv,
    write_requests_csv,
    write_summary_json,
)
from pddemu.metrics.records import InstanceReport, RequestRecord
from pddemu.metrics.report import REPORT_FILE, write_report
from pddemu.metrics.summary import SLO, judge_unmatched, summarize
from pddemu.metrics.table import format_markdown_table, format_table

__all__ = [
    "REPORT_FILE",
    "REQUESTS_FILE",
    "SLO",
    "SUMMARY_FILE",
    "InstanceReport",
    "MetricsError",
    "RequestRecord",
    "format_markdown_table",
    "format_table",
    "read_requests_csv",
    "judge_unmatched",
    "summarize",
    "write_report",
    "write_requests_csv",
    "write_summary_json",
]

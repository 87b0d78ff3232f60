"""Log formatting: one record is one line whatever its message quotes (issue 23 item 9)."""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest

from shardcache.observability.logs import (
    AccessLogger,
    JsonFormatter,
    TextFormatter,
    escape_controls,
)

HOSTILE = "a\r\nFAKE\x1b[2J\x07\x7f\x85\u2028\u2029\u202e\udcff\x00\tz"
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202e\ud800-\udfff]")


def _record(msg: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("shardcache.test", logging.WARNING, __file__, 1, msg, args, exc_info)


def _raised(message: str) -> BaseException:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise ValueError(message) from inner
    except ValueError as exc:
        return exc


def test_escape_controls_writes_each_character_as_an_escape() -> None:
    assert escape_controls(HOSTILE) == (
        "a\\x0d\\x0aFAKE\\x1b[2J\\x07\\x7f\\x85\\u2028\\u2029\\u202e\\udcff\\x00\\x09z"
    )
    assert escape_controls("plain ünïcode / key-0001.tar") == "plain ünïcode / key-0001.tar"


@pytest.mark.parametrize("where", ["msg", "args"])
def test_a_text_record_is_one_line_with_its_controls_escaped(where: str) -> None:
    record = (
        _record(HOSTILE) if where == "msg" else _record("prefetch of %s failed: %r", HOSTILE, 3)
    )
    line = TextFormatter().format(record)
    assert "\n" not in line and not RAW_CONTROL.search(line), repr(line)
    assert "a\\x0d\\x0aFAKE\\x1b[2J" in line
    line.encode("utf-8")  # a lone surrogate would make the stream's write fail


def test_a_traceback_keeps_its_lines_and_escapes_what_its_exceptions_say() -> None:
    exc = _raised(HOSTILE)
    plain = logging.Formatter("%(message)s").format(_record("failed", exc=exc))
    text = TextFormatter().format(_record("failed: %s", HOSTILE, exc=exc))
    lines = text.split("\n")
    # The same lines Python writes, less the two the message's own CR LF made.
    assert len(lines) == len(plain.split("\n")) - 1
    assert lines[0].endswith("failed: " + escape_controls(HOSTILE))
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1].startswith("ValueError: a\\x0d\\x0aFAKE")
    assert "KeyError: 'inner'" in text and "direct cause" in text
    assert not any(line.startswith("FAKE") for line in lines)
    assert not RAW_CONTROL.search(text)


def test_a_stack_keeps_its_lines() -> None:
    record = _record("here")
    record.stack_info = 'Stack (most recent call last):\n  File "x\x1b.py", line 1'
    text = TextFormatter().format(record)
    assert text.split("\n")[1:] == ["Stack (most recent call last):", '  File "x\\x1b.py", line 1']


def test_a_json_record_is_one_line_and_a_document() -> None:
    exc = _raised(HOSTILE)
    line = JsonFormatter().format(_record("failed: %s", HOSTILE, exc=exc))
    assert "\n" not in line and not RAW_CONTROL.search(line)
    document = json.loads(line)
    assert document["message"] == "failed: " + HOSTILE
    assert "ValueError" in document["exception"]


def test_a_secret_next_to_control_characters_is_still_masked() -> None:
    line = TextFormatter().format(_record("GET %s", "https://u:hunter2@h/k\r\n?sig=abc\x1b"))
    assert "hunter2" not in line and "abc" not in line and not RAW_CONTROL.search(line)


def test_records_of_every_logger_are_escaped_once_configured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from shardcache.observability import logs

    saved = logging.getLogger().handlers[:], logging.getLogger().level
    try:
        logs.configure("debug", "text")
        handler = logging.getLogger().handlers[0]
        assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
        for name in ("", "aiohttp.access", "aiohttp.server", "shardcache.fill", "botocore"):
            logging.getLogger(name).warning("from %s: %s", name or "root", HOSTILE)
        written = capsys.readouterr().err
    finally:
        logging.getLogger().handlers[:], _ = saved[0], logging.getLogger().setLevel(saved[1])
    lines = written.split("\n")
    assert lines[-1] == "" and len(lines) == 6, written
    assert not RAW_CONTROL.search(written.replace("\n", ""))


def test_failures_are_logged_once_per_origin_and_kind_then_summarized(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from shardcache.observability.logs import FailureLog

    now = [0.0]
    failures = FailureLog(logging.getLogger("shardcache.test"), 60.0, lambda: now[0])
    caplog.set_level(logging.DEBUG, "shardcache.test")
    for second in range(100):  # one origin failing two ways, once a second; another once
        now[0] = float(second)
        failures.failed("web", "tls", "read %d failed", second)
        failures.failed("web", "timeout", "read %d timed out", second)
    failures.failed("s3", "tls", "read failed")
    failures.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    summary = "origin web: {} more {} failures in the last {} s (each logged at DEBUG; "
    assert [w.split("counted in shardcache_")[0] for w in warnings] == [
        "read 0 failed",
        "read 0 timed out",
        summary.format(59, "tls", 60),  # the interval is over: summarized, then a new one
        "read 60 failed",
        summary.format(59, "timeout", 60),
        "read 60 timed out",
        "read failed",  # another origin
        summary.format(39, "tls", 39),  # at close()
        summary.format(39, "timeout", 39),
    ]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 2 * 98  # every failure is still there at debug level


def test_recent_failures_are_kept_bounded_newest_last_with_long_texts_cut() -> None:
    from shardcache.observability.logs import RECENT_FAILURES, RECENT_MESSAGE_CHARS, FailureLog

    failures = FailureLog(logging.getLogger("shardcache.test"), 60.0, lambda: 0.0, lambda: 1e9)
    for n in range(RECENT_FAILURES + 5):  # suppressed ones (same origin and kind) count too
        failures.failed("web", "tls", "read %s failed", f"<b>{n}</b>")
    failures.failed("s3", "timeout", "%s", "k" * 5000)
    recent = failures.recent()
    assert len(recent) == RECENT_FAILURES
    assert recent[0] == {
        "at": 1e9,
        "origin": "web",
        "kind": "tls",
        "message": "read <b>6</b> failed",
    }
    assert recent[-1]["kind"] == "timeout"
    assert recent[-1]["message"] == "k" * RECENT_MESSAGE_CHARS + "…"
    failures.close()


def test_printable_escapes_what_a_terminal_would_act_on() -> None:
    """The CLI's one helper for text from daemons and origins: the log's rule, on one line."""
    from shardcache.printable import printable

    assert printable("a\x1b]0;t\x07\x1b[2J\r\nb\u202e\x85c") == (
        "a\\x1b]0;t\\x07\\x1b[2J\\x0d\\x0ab\\u202e\\x85c"
    )
    assert printable(42) == "42"
    assert printable(printable("\x1b")) == printable("\x1b")  # escaping twice changes nothing


def test_the_logger_names_log_readers_filter_on_stay_as_they_were() -> None:
    """Every log line names its logger (`shardcache.fill: ...`, JSON's "logger"), and people
    filter and alert on those names: moving a module must not rename its logger (a folder
    move once renamed four). A new name is added here on purpose, or not at all."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[3] / "shardcache"
    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
            ):
                arg = node.args[0]
                names.add(arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg))
    assert names == {
        "aiohttp.access",
        "aiohttp.server",
        "shardcache.cache",
        "shardcache.checksums",
        "shardcache.connections",
        "shardcache.daemon",
        "shardcache.fill",
        "shardcache.notify",
        "shardcache.origin",
        "shardcache.origins",
        "shardcache.prefetch",
        "shardcache.scrub",
        "shardcache.server",
        "shardcache.store",
        "shardcache.webdataset",
        "__name__",  # origins.receivers and origins.receiver_handle: shardcache.origins.*
        "noisy",  # `configure` quietens botocore, boto3, urllib3 and s3transfer
    }


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://alice:pw@h/x", "https://alice:***@h/x"),
        ("http://:sekret@h/", "http://:***@h/"),  # a token as the password, no user
        ("http://sekret@h/", "http://***@h/"),  # a token as the user name
        ("http://h/?access_token=sekret&a=1", "http://h/?access_token=***&a=1"),  # RFC 6750
        (
            "http://h/?X-Goog-Signature=s&X-Goog-Date=1",
            "http://h/?X-Goog-Signature=***&X-Goog-Date=1",
        ),
        ("http://h/?sv=1&sig=s", "http://h/?sv=1&sig=***"),  # an Azure SAS
        (
            "https://h/p?X-Amz-Credential=AK&X-Amz-Signature=ff",
            "https://h/p?X-Amz-Credential=***&X-Amz-Signature=***",
        ),
        ("http://h/?key=AIza", "http://h/?key=***"),
        ("Authorization: Bearer abc.def", "Authorization: Bearer ***"),
        (
            "http://h/a@b and s3://bucket/k?partNumber=1",
            "http://h/a@b and s3://bucket/k?partNumber=1",
        ),
    ],
)
def test_redact_masks_every_credential_a_url_or_header_can_carry(text: str, shown: str) -> None:
    from shardcache.observability.logs import redact

    assert redact(text) == shown


@pytest.mark.parametrize("created", [1_700_000_000.0004, 1_700_000_000.9999, 1_800_000_059.5])
def test_the_time_of_a_text_line_is_the_one_logging_writes(created: float) -> None:
    """TextFormatter makes the date part once a second; the text must be logging's own."""
    record = _record("m")
    record.created, record.msecs = created, (created - int(created)) * 1000
    mine = TextFormatter()
    assert mine.formatTime(record) == logging.Formatter().formatTime(record)
    record.created += 1.0  # the next second: made afresh
    assert mine.formatTime(record) == logging.Formatter().formatTime(record)


@pytest.mark.parametrize(
    ("level", "enabled"), [("WARNING", False), ("INFO", True), ("DEBUG", True)]
)
def test_access_lines_are_skipped_whole_above_info(level: str, enabled: bool) -> None:
    """At WARNING (the benchmarks', and a quiet deployment's) aiohttp is told there is no
    access log, so it builds nothing per request; at INFO and DEBUG it logs."""
    logger = logging.getLogger("shardcache.test-access")
    logger.setLevel(level)
    assert AccessLogger(logger, "").enabled is enabled

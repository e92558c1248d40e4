"""tools/sglang_texts.py and the inventory of SGLang's memory texts it keeps (tools/sglang-texts/<release>.yaml).

The tool is tested on a small source tree made here (and the same tree as a wheel). The committed inventory of the
pinned release is checked against the catalog and the golden cases: every text mapped or excluded, every mapped
text's golden present, counting the mapped kind and holding the text. Where the release's wheel is at hand
(tools/test.sh downloads it into .cache/sglang-wheels; SGLANG_TEXTS_WHEEL names another), a slow test reads it
again and fails on any text the inventory does not have; without the wheel it skips and says so.
"""

from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_oom_exporter.scan.run import scan_paths
from tests.support.golden import LOGS_DIR, load_expected
from tests.support.helpers import CATALOG
from tools import sglang_texts

ROOT = Path(__file__).resolve().parent.parent
INVENTORIES = ROOT / "tools" / "sglang-texts"
WHEELS = ROOT / ".cache" / "sglang-wheels"

SOURCE = """\
import logging
import warnings

logger = logging.getLogger(__name__)


class TokenPool:
    def alloc(self, need, free):
        if free < need:
            msg = f"Out of memory. Need {need} tokens, have {free}."
            raise RuntimeError(msg)
        assert free >= 0, "pool size went negative"
        assert need > 0

    def evict(self, n):
        logger.warning("evicted %d tokens from the %s pool", n, "full")
        logger.debug("evicting %d", n)
        raise ValueError("bad eviction request")

    class Inner:
        def leak(self, total):
            warnings.warn("Memory pool leak detected! total={}".format(total))


def configure(ratio):
    if ratio <= 0:
        raise ValueError("Not enough host memory: ratio " + str(ratio) + " leaves " + "nothing")
    logger.info("configured the scheduler with ratio %.2f", ratio)
    raise NotImplementedError("out of memory handling is not implemented")


def helper():
    logger.error("KV cache is full" if True else "pool exhausted")
    raise TimeoutError("took too long")


def sized(total, fraction):
    msg = "Not enough memory."
    if fraction is not None:
        msg += f" Current value: {fraction}"
    msg += " Raise it."
    raise RuntimeError(msg)


def _exhausted(need):
    return RuntimeError(f"pool exhausted: need {need}")
"""
# What the vocabulary lists from SOURCE, in key order: the function as Class.method, holes as "*", a name's last
# assignment followed (a part added under an `if` optional, "{?...}"), an exception built to be raised elsewhere, a
# message that does not speak of memory only inside an allocation or eviction function.
EXPECTED = [
    ("srt/mem_cache/pool.py", "TokenPool.Inner.leak", "warnings.warn", "Memory pool leak detected! total=*", 22),
    ("srt/mem_cache/pool.py", "TokenPool.alloc", "assert", "pool size went negative", 12),
    ("srt/mem_cache/pool.py", "TokenPool.alloc", "raise RuntimeError", "Out of memory. Need * tokens, have *.", 11),
    ("srt/mem_cache/pool.py", "TokenPool.evict", "logger.warning", "evicted * tokens from the * pool", 16),
    ("srt/mem_cache/pool.py", "TokenPool.evict", "raise ValueError", "bad eviction request", 18),
    ("srt/mem_cache/pool.py", "_exhausted", "construct RuntimeError", "pool exhausted: need *", 46),
    ("srt/mem_cache/pool.py", "configure", "raise ValueError", "Not enough host memory: ratio * leaves nothing", 27),
    ("srt/mem_cache/pool.py", "helper", "logger.error", "KV cache is full | pool exhausted", 33),
    ("srt/mem_cache/pool.py", "sized", "raise RuntimeError", "Not enough memory.{? Current value: *} Raise it.", 42),
]


def _tree(root: Path) -> Path:
    for rel, text in (("sglang/srt/mem_cache/pool.py", SOURCE), ("sglang/lang/other.py", SOURCE),
                      ("sglang/srt/broken.py", "def f(:\n"),
                      ("sglang-0.9.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 0.9.1\n")):  # fmt: skip
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _wheel(tree: Path, directory: Path) -> Path:
    wheel = directory / "sglang-0.9.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                out.write(path, path.relative_to(tree).as_posix())
    return wheel


def _rows(texts: list[sglang_texts.Text]) -> list[tuple[str, str, str, str, int]]:
    return [(t.file, t.function, t.call, t.message, t.line) for t in texts]


def test_the_tool_lists_the_memory_texts_of_a_source_tree_and_of_its_wheel(tmp_path):
    # Outside srt/ (sglang/lang), a debug log, NotImplementedError, an INFO line and a failure that does not speak of
    # memory outside an allocating function are not listed; a file that does not parse has no texts.
    tree = _tree(tmp_path / "tree")
    assert _rows(sglang_texts.release_texts(tree)) == EXPECTED
    assert sglang_texts.release_version(tree) == "0.9.1"
    wheel = _wheel(tree, tmp_path)
    assert _rows(sglang_texts.release_texts(wheel)) == EXPECTED
    assert sglang_texts.release_version(wheel) == "0.9.1"


def test_a_key_survives_a_line_shift_and_a_reworded_text_is_new(tmp_path, capsys):
    tree = _tree(tmp_path / "tree")
    inventory = tmp_path / "inv.yaml"
    drafted = sglang_texts.draft(sglang_texts.release_texts(tree), None, "0.9.1")
    assert [r["decide"] for r in drafted["texts"]] == ["kind + golden, or excluded + reason"] * len(EXPECTED)
    for row in drafted["texts"]:
        del row["decide"]
        row["excluded"] = "test"
    inventory.write_text(sglang_texts.dump(drafted))
    assert sglang_texts.main(["check", str(tree), "--inventory", str(inventory)]) == 0
    assert "9 memory texts" in capsys.readouterr().out

    pool = tree / "sglang" / "srt" / "mem_cache" / "pool.py"
    pool.write_text("\n\n" + SOURCE.replace("bad eviction request", "eviction request refused"))
    assert sglang_texts.main(["check", str(tree), "--inventory", str(inventory)]) == 1
    out = capsys.readouterr().out
    assert "1 new, 1 no longer in the release, 0 undecided" in out
    assert "  srt/mem_cache/pool.py:20 TokenPool.evict: raise ValueError 'eviction request refused'" in out
    assert "  srt/mem_cache/pool.py:18 TokenPool.evict: raise ValueError 'bad eviction request'" in out

    # draft keeps the decisions of the keys it still has (at their new lines) and asks about the new text only
    assert sglang_texts.main(["draft", str(tree), "--inventory", str(inventory)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["release"], printed["source"]) == ("0.9.1", "tree")
    redrafted = sglang_texts.draft(sglang_texts.release_texts(tree), sglang_texts.load_inventory(inventory), "0.9.2")
    decided = {(r["message"], r["line"]): r.get("excluded", r.get("decide")) for r in redrafted["texts"]}
    assert decided[("eviction request refused", 20)] == "kind + golden, or excluded + reason"
    assert decided[("Out of memory. Need * tokens, have *.", 13)] == "test"
    assert redrafted["release"] == "0.9.2"


def test_check_fails_on_an_undecided_row(tmp_path, capsys):
    tree = _tree(tmp_path / "tree")
    inventory = tmp_path / "inv.yaml"
    drafted = sglang_texts.draft(sglang_texts.release_texts(tree), None, "0.9.1")
    inventory.write_text(sglang_texts.dump(drafted))
    assert sglang_texts.main(["check", str(tree), "--inventory", str(inventory)]) == 1
    assert "0 new, 0 no longer in the release, 9 undecided" in capsys.readouterr().out


def _newest() -> Path:
    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", path.stem))

    return max(INVENTORIES.glob("*.yaml"), key=version)


INVENTORY = _newest()
ROWS: list[dict[str, Any]] = sglang_texts.load_inventory(INVENTORY)["texts"]


def _pattern(message: str) -> re.Pattern[str]:
    """A row's message as a regex over a log: each alternative's first line, `*` any run of characters, `{?part}`
    the part or nothing."""

    def literal(text: str) -> str:
        return ".*?".join(map(re.escape, text.split("*")))

    def alternative(text: str) -> str:
        pieces = re.split(r"\{\?([^{}]*)\}", text.split("\\n")[0].strip())
        return "".join(f"(?:{literal(p)})?" if i % 2 else literal(p) for i, p in enumerate(pieces))

    return re.compile("|".join(alternative(alt) for alt in message.split(" | ")))


def test_every_text_of_the_pinned_release_is_mapped_or_excluded_with_a_known_reason():
    inventory = sglang_texts.load_inventory(INVENTORY)
    reasons = set(inventory["reasons"])
    wrong = []
    for row in ROWS:
        where = f"{row['file']}:{row['line']} {row['function']}: {row['message']!r}"
        if bool(row.get("kind")) == bool(row.get("excluded")):
            wrong.append(f"{where}: needs exactly one of kind (with golden) or excluded")
        elif row.get("kind") and row["kind"] not in CATALOG.ids:
            wrong.append(f"{where}: kind {row['kind']!r} is not in the catalog")
        elif row.get("excluded") and row["excluded"] not in reasons:
            wrong.append(f"{where}: reason {row['excluded']!r} is not one of `reasons`")
    keys = [sglang_texts.row_key(r) for r in ROWS]
    assert keys == sorted(set(keys)), "rows must be unique and sorted by key (file, function, call, message)"
    assert not wrong, f"{INVENTORY.name}:\n" + "\n".join(wrong)


def test_every_mapped_text_has_a_golden_that_counts_its_kind_and_holds_the_text():
    goldens: dict[str, dict[str, int]] = {}
    wrong = []
    for row in (r for r in ROWS if r.get("kind")):
        case, kind = row.get("golden"), row["kind"]
        where = f"{row['file']}:{row['line']} {row['function']} -> {kind}, golden {case}"
        log = LOGS_DIR / f"{case}.log"
        if not case or not log.is_file():
            wrong.append(f"{where}: no such golden case")
            continue
        if case not in goldens:
            counts = scan_paths(CATALOG, [str(log)]).to_json()["counts"]
            expected = load_expected(log).get("counts") or {}
            goldens[case] = counts if all(counts[k] == expected.get(k, 0) for k in counts) else {}
        if not goldens[case]:
            wrong.append(f"{where}: the golden does not pass (scan's counts differ from its expected)")
        elif goldens[case].get(kind, 0) < 1:
            wrong.append(f"{where}: the golden counts no {kind}")
        elif not _pattern(row["message"]).search(log.read_text(encoding="utf-8", errors="replace")):
            wrong.append(f"{where}: the golden's log does not hold the text")
    assert not wrong, f"{INVENTORY.name}, mapped texts without a passing golden:\n" + "\n".join(wrong)


def _wheel_of(release: str) -> Path | None:
    named = os.environ.get("SGLANG_TEXTS_WHEEL")
    if named:
        return Path(named)
    found = sorted(WHEELS.glob(f"sglang-{release}-*.whl"))
    return found[0] if found else None


# About 20 s of CPU to parse the wheel's 4,700 files (70 s wall at load 9 on 2 cores): a hang guard, not a budget.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_pinned_release_has_no_text_the_inventory_lacks():
    release = str(sglang_texts.load_inventory(INVENTORY)["release"])
    wheel = _wheel_of(release)
    if wheel is None or not wheel.is_file():
        pytest.skip(f"no SGLang {release} wheel in {WHEELS} (tools/test.sh downloads it; or set SGLANG_TEXTS_WHEEL)")
    texts = sglang_texts.release_texts(wheel)
    new, gone = sglang_texts.compare(texts, sglang_texts.load_inventory(INVENTORY))
    listing = "\n".join(f"  {t.file}:{t.line} {t.function}: {t.call} {t.message!r}" for t in new)
    assert not new, f"texts of {wheel.name} that {INVENTORY.name} neither maps nor excludes:\n{listing}"
    assert [sglang_texts.row_key(r) for r in gone] == []
    assert len(texts) == len(ROWS)


def test_the_weekly_workflow_checks_the_newest_wheel_against_the_newest_inventory(tmp_path):
    # actionlint checks the file (tests/test_release.py); this checks what it does: weekly, the newest wheel
    # without dependencies, and the tool's check on the inventory `sort -V` puts last, which is _newest()'s.
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "sglang-texts.yml").read_text(encoding="utf-8"))
    assert workflow[True] == {"schedule": [{"cron": "23 5 * * 1"}], "workflow_dispatch": None}  # YAML 1.1: on
    runs = [step.get("run", "") for step in workflow["jobs"]["new-texts"]["steps"]]
    download = next(r for r in runs if "pip download" in r)
    assert "--no-deps" in download
    assert "sglang -d wheel" in download
    assert "==" not in download
    check = next(r for r in runs if "sglang_texts.py check" in r)
    assert "find tools/sglang-texts -name '*.yaml' | sort -V | tail -n 1" in check
    for name in ("0.5.9.yaml", "0.5.23.yaml", "0.10.0.yaml"):
        (tmp_path / name).write_text("")
    newest = subprocess.run(["sh", "-c", f"find {tmp_path} -name '*.yaml' | sort -V | tail -n 1"],
                            capture_output=True, text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
    assert Path(newest).name == "0.10.0.yaml"
    picked = subprocess.run(["sh", "-c", "find tools/sglang-texts -name '*.yaml' | sort -V | tail -n 1"], cwd=ROOT,
                            capture_output=True, text=True, check=True, timeout=30).stdout.strip()  # fmt: skip
    assert ROOT / picked == INVENTORY  # the workflow checks the inventory these tests check

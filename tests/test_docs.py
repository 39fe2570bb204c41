"""The README and every page of docs/: every link resolves, every page is linked from the README, and
every example shown in a page runs (issue 28, item 6).

Examples: every fenced ``sh``/``bash`` block is run as a bash script (``set -e``), the ``$ `` lines of a
``console`` block (a command and its output) likewise, every ``python``
block with the project's Python, every ``yaml`` block is loaded as a scenario; the blocks of one page
run in order in one sandbox (so a later block may use what an earlier one wrote): a folder whose
``repo/`` links every top-level entry of the repository (the working directory) and whose ``shared``
links ``../shared``, with ``cbsim`` and ``python`` on the PATH and ``/tmp/`` in a command rewritten
into the sandbox. An HTML comment before a block (invisible on GitHub) adapts it for the test, one
directive per comment:

- ``<!-- doctest: set KEY=VALUE -->``: append ``--set KEY=VALUE`` to each ``cbsim run|sweep|capacity|
  plan`` command of the block (a long example runs at a small size, the same command otherwise);
- ``<!-- doctest: sub OLD => NEW -->``: replace text (a user's own file by a reference one);
- ``<!-- doctest: base FILE -->``: a ``yaml`` block is a section, loaded over this scenario file;
- ``<!-- doctest: fails -->``: the block shows a refusal: it must exit non-zero with an ``error:`` line
  and no traceback;
- ``<!-- doctest: skip REASON -->``: not run, only where running is impossible here (a live vLLM
  server, a GPU, the git history, many minutes); the reason is the skip message;
- ``<!-- doctest: output-not-verbatim REASON -->``: a ``console`` block whose output lines are a
  condensed or hand-made form of what the command prints (a summary, a column dropped); the commands
  still run, the output is not compared; the reason says why.

The output a ``console`` block shows is checked against what its commands print (stdout and stderr):
every shown line must be a printed line, compared after collapsing whitespace and rich's box
characters (a table row compares by its cells, whatever its column padding), with the block's
``sub`` rules applied to the shown lines too. Consecutive shown lines may be one printed line wrapped
for the page (they are compared joined by a space), a line ``...`` marks printed lines left out and a
table cell ``...`` a column left out.
The commands run with ``COLUMNS`` wide enough that rich prints every table whole, as a reader's
terminal shows it. So a figure shown goes stale loudly: the failure names the page, the block, the
shown line and the closest printed one.

A ``yaml`` block whose first line is ``# NAME.yaml`` is also written to ``NAME.yaml`` in the sandbox, so
a later command of the page runs the file the page shows. A command shown anywhere else (an unlabelled
or ``text`` fence, an indented block) is never run, so ``test_every_command_shown_is_tested`` refuses it.

A page added later needs nothing here: it is found by the glob, and the README's task index links it.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
SHARED = REPO.parent / "shared"
BLOCK_TIMEOUT_S = 600

_FENCE = re.compile(r"^```(\w*)\s*$")
_DIRECTIVE = re.compile(r"^<!--\s*doctest:\s*([\w-]+)\s*(.*?)\s*-->\s*$")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
_RUNS = re.compile(r"^(\s*cbsim\s+(?:run|sweep|capacity|plan)\s)")
# rich's box-drawing characters (tables, rules, panels): a vertical one separates cells, the rest draw
_CELL_SEP = "│┃║╎╏┆┇┊┋"
_BOX = re.compile(r"[\u2500-\u257f]")
# Wide enough that every table prints whole (a narrower console stacks it one block per row).
COLUMNS = "400"


def blocks(page: Path) -> list[dict]:
    """The fenced blocks of a page: language, text, the directives before it and its line."""
    out, directives, lines = [], [], page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _DIRECTIVE.match(lines[i])
        if m:
            directives.append((m.group(1), m.group(2)))
            i += 1
            continue
        m = _FENCE.match(lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            out.append({"lang": m.group(1), "text": "\n".join(lines[i + 1:end]), "line": i + 1,
                        "directives": directives})
            directives, i = [], end + 1
            continue
        if lines[i].strip():
            directives = []  # a directive applies to the block right after it
        i += 1
    return out


def _prose(page: Path) -> str:
    """The page without its fenced blocks (a link inside code is not a link)."""
    text = page.read_text(encoding="utf-8")
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in _prose(page).splitlines() if re.match(r"^#{1,6} ", line)}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_link_resolves(page):
    bad = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not checked (no network)
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: {dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not bad, f"{page.name}: broken links: {bad}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in _LINK.findall(_prose(README))}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"README links no row to {missing}: add it to the task index ('I want to ...')"


def test_the_readme_is_what_a_newcomer_needs_in_ten_minutes():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300
    text = "\n".join(lines)
    for must in ("## I want to ...", "## Commands", "make run", "make test", "docs/accuracy.md", ".png)"):
        assert must in text


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_example_runs(page, tmp_path):
    found = [b for b in blocks(page) if b["lang"] in ("sh", "bash", "console", "python", "yaml")]
    if not found:
        pytest.skip(f"{page.name} shows no example")
    sandbox = _sandbox(tmp_path)
    skipped, stale = [], []
    for b in found:
        d = b["directives"]
        reason = next((v for k, v in d if k == "skip"), None)
        if reason is not None:
            assert reason, f"{page.name}:{b['line']}: a skip needs its reason"
            skipped.append(f"line {b['line']}: {reason}")
            continue
        text = b["text"]
        if b["lang"] == "console":  # the commands shown, not their output
            text = _console_commands(text)
        text = _adapt(text, d, sandbox)
        if "../shared" in text and not SHARED.is_dir():
            if os.environ.get("CI"):
                pytest.fail(f"{SHARED} is missing: {page.name}:{b['line']} needs ../shared/reference")
            skipped.append(f"line {b['line']}: needs {SHARED}")
            continue
        where = f"{page.name}:{b['line']}"
        if b["lang"] == "yaml":
            _load_yaml(text, d, where)
            name = re.match(r"#\s*([\w.-]+\.ya?ml)\s*$", text.splitlines()[0] if text else "")
            if name:
                (sandbox / name.group(1)).write_text(text, encoding="utf-8")
        else:
            printed = _run(b["lang"], text, sandbox, where, fails=any(k == "fails" for k, _ in d))
            if b["lang"] == "console":
                verbatim = next((v for k, v in d if k == "output-not-verbatim"), None)
                if verbatim is None:
                    printed = printed.replace(f"{sandbox.parent.parent / 'tmp'}/", "/tmp/")
                    bad = unprinted_lines(_console_output(_adapt_output(b["text"], d)), printed)
                    if bad:
                        stale.append(_mismatch_message(where, b["text"], bad))
                else:
                    assert verbatim, f"{where}: output-not-verbatim needs its reason (what the output condenses)"
    assert not stale, "\n\n".join(stale)  # after every block ran: all of a page's stale output at once
    if skipped and len(skipped) == len(found):
        pytest.skip("; ".join(skipped))


# A command line as a page shows it: ``cbsim SUBCOMMAND`` or a ``bench/`` script, with or without ``$ ``.
_COMMAND = re.compile(r"^\s*(?:\$ )?(?:cbsim [a-z]|(?:\S*/)?python3? bench/)")
_TESTED = ("sh", "bash", "console", "python")
# Pages another change is editing now; each is to be dropped from here once its commands are labelled.
_NOT_YET: dict[str, str] = {}


def untested_commands(page: Path) -> list[str]:
    """The command lines a page shows where test_every_example_runs never runs them: in a fence of
    another language (or none), or in an indented block."""
    out, fence, lines = [], None, page.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        m = _FENCE.match(line) if fence is None else None
        if m:
            fence = m.group(1)
            continue
        if fence is not None and line.startswith("```"):
            fence = None
            continue
        code = fence is not None or line.startswith("    ")
        if code and fence not in _TESTED and _COMMAND.match(line):
            out.append(f"{page.name}:{i}: {line.strip()[:80]}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_shown_is_tested(page):
    if page.name in _NOT_YET:
        pytest.skip(_NOT_YET[page.name])
    bad = untested_commands(page)
    assert not bad, (
        f"commands shown outside a tested block: {bad}; put them in a ```console (``$ `` lines) "
        "or ```sh fence, with <!-- doctest: set/sub/fails/skip REASON --> as needed"
    )


def test_untested_commands_finds_what_no_test_runs(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "cbsim answers a question (prose).\n\n```\n$ cbsim run a.yaml\nout\n```\n\n"
        "    cbsim plan b.yaml\n\n```text\npython bench/sim_speed.py\n```\n\n"
        "```console\n$ cbsim run c.yaml\n```\n\n```sh\ncbsim sweep d.yaml\n```\n",
        encoding="utf-8",
    )
    assert [x.split(": ", 1)[1] for x in untested_commands(page)] == [
        "$ cbsim run a.yaml",
        "cbsim plan b.yaml",
        "python bench/sim_speed.py",
    ]


def _console_commands(text: str) -> str:
    """The ``$ `` lines of a console block, each with the lines that continue it (while its double
    quotes are open, or it ends with a backslash); the rest is output."""
    out: list[str] = []
    for line in text.splitlines():
        if out and (out[-1].count('"') % 2 or out[-1].endswith("\\")):
            out[-1] += "\n" + line
        elif line.startswith("$ "):
            out.append(line[2:])
    return "\n".join(out)


def _console_output(text: str) -> list[str]:
    """The output lines of a console block: every line that is not a command (see
    :func:`_console_commands`) nor a continuation of one."""
    out: list[str] = []
    command = None
    for line in text.splitlines():
        if command is not None and (command.count('"') % 2 or command.endswith("\\")):
            command += "\n" + line
        elif line.startswith("$ "):
            command = line[2:]
        else:
            command = None
            out.append(line)
    return out


def normalise(line: str) -> str:
    """A line as compared: rich's vertical box characters as one cell separator ``│``, every other box
    character dropped, whitespace runs collapsed, separators at the ends dropped. A table row then
    reads ``cell │ cell │ ...`` whatever its column widths and header style; a border line reads as
    nothing; an ASCII ``|`` is text."""
    for ch in _CELL_SEP:
        line = line.replace(ch, "\0")
    line = _BOX.sub(" ", line).replace("\0", " │ ")
    line = " ".join(line.split())
    return re.sub(r"^(?:│ ?)+|(?: ?│)+$", "", line).strip()


def unprinted_lines(shown: list[str], printed: str) -> list[tuple[str, str]]:
    """The shown output lines that are not printed lines, each with the closest printed line.

    Consecutive shown lines that are not printed one by one pass when joined by a space they are one
    printed line (a long line wrapped for the page); a line ``...`` stands for printed lines left out,
    a cell ``...`` for one column; lines of box characters only (borders) and blank lines are not
    compared."""
    lines = [normalise(x) for x in printed.splitlines()]
    have = {x for x in lines if x}
    wanted = [x for x in (normalise(s) for s in shown) if x and x not in ("...", "…")]
    bad, i = [], 0
    while i < len(wanted):
        if wanted[i] in have or _elided_cells_match(wanted[i], have):
            i += 1
            continue
        for j in range(i + 1, min(i + 8, len(wanted))):
            if " ".join(wanted[i:j + 1]) in have:
                i = j + 1
                break
        else:
            close = difflib.get_close_matches(wanted[i], [x for x in lines if x], n=1, cutoff=0.0)
            bad.append((wanted[i], close[0] if close else "(the command printed nothing)"))
            i += 1
    return bad


def _elided_cells_match(shown: str, have: set[str]) -> bool:
    """A table row shown with a cell ``...`` (a column left out for the page's width) matches a printed
    row with any one cell there and every other cell equal."""
    cells = shown.split(" │ ")
    if "..." not in cells or len(cells) < 2:
        return False
    pattern = re.compile(" │ ".join("[^│]*" if c == "..." else re.escape(c) for c in cells))
    return any(pattern.fullmatch(x) for x in have)


def _adapt_output(text: str, directives) -> str:
    """The block as shown, with its ``sub`` rules applied (the output names what the command ran)."""
    for key, value in directives:
        if key == "sub":
            old, _, new = value.partition(" => ")
            text = text.replace(old, new)
    return text


def _mismatch_message(where: str, block: str, bad: list[tuple[str, str]]) -> str:
    first = block.splitlines()[0] if block else ""
    lines = [f"{where} (the console block starting {first!r}) shows output its command does not print now:"]
    for shown, close in bad:
        lines += [f"  shown:           {shown}", f"  closest printed: {close}"]
    lines.append("Update the page's figures to what the command prints (the simulator is deterministic for a "
                 "seed), or, if the block is a condensed form, mark it <!-- doctest: output-not-verbatim REASON -->.")
    return "\n".join(lines)


def _sandbox(tmp_path: Path) -> Path:
    repo = tmp_path / "work" / "repo"
    repo.mkdir(parents=True)
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv", ".venv-vllm", "results"):
            (repo / entry.name).symlink_to(entry)
    if SHARED.is_dir():
        (tmp_path / "work" / "shared").symlink_to(SHARED)
    (tmp_path / "tmp").mkdir()
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "cbsim").write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "from sim.cli.main import main; main()" "$@"\n')
    (bin_ / "cbsim").chmod(0o755)
    (bin_ / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # a link would lose the venv
    (bin_ / "python").chmod(0o755)
    return repo


def _adapt(text: str, directives, sandbox: Path) -> str:
    text = re.sub(r"\\\n\s*", " ", text)  # continuation lines: one command each
    text = text.replace("/tmp/", f"{sandbox.parent.parent / 'tmp'}/")
    for key, value in directives:
        if key == "sub":
            old, _, new = value.partition(" => ")
            assert old in text, f"doctest sub: {old!r} is not in the block"
            text = text.replace(old, new)
    sets = " ".join(f"--set {v}" for k, v in directives if k == "set")
    if sets:
        lines = [ln.split(" #")[0].rstrip() + f" {sets}" if _RUNS.match(ln) else ln for ln in text.splitlines()]
        assert any(_RUNS.match(ln) for ln in lines), "doctest set: the block runs no cbsim run/sweep/capacity/plan"
        text = "\n".join(lines)
    return text


def _run(lang: str, text: str, sandbox: Path, where: str, fails: bool = False) -> str:
    """Run a block; what it printed (stdout, then stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{sandbox.parent.parent / 'bin'}:{os.environ['PATH']}",
           "MPLBACKEND": "Agg", "COLUMNS": COLUMNS}
    cmd = ["bash", "-euo", "pipefail", "-c", text] if lang != "python" else [sys.executable, "-c", text]
    try:
        proc = subprocess.run(cmd, cwd=sandbox, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{where}: the example ran over {BLOCK_TIMEOUT_S} s; give it a doctest set (a smaller run)")
    assert "Traceback" not in proc.stderr, f"{where}: {proc.stderr[-3000:]}"
    if fails:
        assert proc.returncode != 0, f"{where}: shown as refused, but it ran (exit 0)\n{text}"
        assert "error:" in proc.stdout + proc.stderr, (
            f"{where}: refused without an error: line\n{proc.stderr[-3000:]}"
        )
        return proc.stdout + "\n" + proc.stderr
    assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{text}\n--- stderr\n{proc.stderr[-3000:]}"
    return proc.stdout + "\n" + proc.stderr


def _load_yaml(text: str, directives, where: str) -> None:
    from sim.scenario.schema import load_scenario

    data = yaml.safe_load(text)
    base = next((v for k, v in directives if k == "base"), None)
    if base:
        merged = yaml.safe_load((REPO / base).read_text())
        merged.update(data)
        data = merged
    try:
        load_scenario(data)
    except Exception as exc:  # noqa: BLE001 - the message is the point
        pytest.fail(f"{where}: the YAML shown does not load as a scenario: {exc}")


def test_console_output_check_fails_on_a_line_not_printed():
    """The comparison of a console block's output: a table row matches whatever its padding and box
    characters, a wrapped line matches joined, and a changed figure fails with the closest line."""
    printed = (
        "┏━━━━━━━━━┳━━━━━━┳━━━━━━━━━━━━━━━━━┓\n"
        "┃ policy  ┃ GPUs ┃ max concurrency ┃\n"
        "┡━━━━━━━━━╇━━━━━━╇━━━━━━━━━━━━━━━━━┩\n"
        "│ vllm-v1 │    1 │              77 │\n"
        "└─────────┴──────┴─────────────────┘\n"
        "vllm-v1: a note long enough that the page wraps it\n"
        "mean |rel| 2.8%\n"
    )
    block = (
        "$ cbsim capacity \"a\n"
        "b.yaml\"\n"
        "│ policy │ GPUs │ max concurrency │\n"
        "│ vllm-v1 │ 1 │ 77 │\n"
        "...\n"
        "vllm-v1: a note long enough\n"
        "that the page wraps it\n"
        "mean\n"
        "|rel| 2.8%\n"
    )
    shown = _console_output(block)
    assert shown[0].startswith("│ policy")  # the continuation of the quoted command is not output
    assert unprinted_lines(shown, printed) == []
    stale = block.replace("│ 77 │", "│ 78 │")
    assert unprinted_lines(_console_output(stale), printed) == [("vllm-v1 │ 1 │ 78", "vllm-v1 │ 1 │ 77")]
    assert unprinted_lines(["vllm-v1: a note long enough"], printed)  # a fragment is not a line
    assert unprinted_lines(["77"], printed)  # nor is one cell
    assert unprinted_lines(["│ vllm-v1 │ ... │ 77 │"], printed) == []  # a column left out
    assert unprinted_lines(["│ vllm-v1 │ ... │ 78 │"], printed)
    message = _mismatch_message("p.md:3", block, unprinted_lines(_console_output(stale), printed))
    assert "p.md:3" in message and "shown:           vllm-v1 │ 1 │ 78" in message
    assert "closest printed: vllm-v1 │ 1 │ 77" in message and "output-not-verbatim" in message


def test_a_stale_console_block_fails_its_page(tmp_path):
    """End to end through test_every_example_runs: a console block whose shown output the command does
    not print fails, naming the page, the block's line, the shown line and the closest printed one;
    the same block with a reasoned output-not-verbatim marker passes, one without a reason fails."""
    page = tmp_path / "page.md"
    body = "```console\n$ printf 'rate  %s\\n' 21.4 22.2\nrate 21.4\nrate 22.9\n```\n"
    page.write_text(body, encoding="utf-8")
    with pytest.raises(AssertionError) as err:
        test_every_example_runs(page, tmp_path / "a")
    message = str(err.value)
    assert "page.md:1" in message and "shown:           rate 22.9" in message
    assert "closest printed: rate 22.2" in message and "shown:           rate 21.4" not in message
    page.write_text(body.replace("22.9", "22.2"), encoding="utf-8")
    test_every_example_runs(page, tmp_path / "b")
    page.write_text("<!-- doctest: output-not-verbatim rounded by hand -->\n" + body, encoding="utf-8")
    test_every_example_runs(page, tmp_path / "c")
    page.write_text("<!-- doctest: output-not-verbatim -->\n" + body, encoding="utf-8")
    with pytest.raises(AssertionError, match="needs its reason"):
        test_every_example_runs(page, tmp_path / "d")

"""Project-level checks: CI runs the README's test command, every command the README and the ``docs/`` pages show
parses, their links resolve, the bundled corpus is well-formed.

Run as a script (``python tests/test_project.py PROGRAM...``) it prints each program's ``--help`` as JSON: the test
of the shown commands runs it in a fresh interpreter, so that running the commands' modules as ``__main__`` leaves
the test process as it was.
"""

from __future__ import annotations

import gzip
import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The README and the documentation pages it links: every command they show is checked below.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Commands shown that are not the project's: the installer, the shell's ``export``, the test runner (the README's
#: test command is checked against ``.ci/run`` below).
NOT_OURS = (("pip",), ("export",), ("python", "-m", "pytest"))
#: Modules whose first argument is a subcommand (``python -m tokenizer train ...``).
SUBCOMMANDS = ("tokenizer", "training.hub")


def _bash_blocks(markdown: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)]


def _shown_commands() -> list[tuple[str, list[str]]]:
    """Every command of the bash blocks of ``PAGES`` as (page, words): continuation lines joined, comments dropped,
    ``&&`` chains split into their commands, leading ``NAME=value`` settings dropped."""
    commands = []
    for page in PAGES:
        for block in _bash_blocks(page.read_text(encoding="utf-8")):
            for line in block.replace("\\\n", " ").splitlines():
                for part in line.split("&&"):
                    words = shlex.split(part, comments=True)
                    while words and re.fullmatch(r"\w+=\S*", words[0]):
                        words = words[1:]
                    if words:
                        commands.append((page.name, words))
    return commands


def _program(words: list[str]) -> tuple[tuple[str, ...], list[str], list[str]]:
    """A shown command as (program, its arguments, ``accelerate launch``'s arguments). The program is
    ``("-m", module[, subcommand])`` or ``(script,)``; ``accelerate launch pretrain`` runs the ``pretrain`` package, as
    ``python -m pretrain`` does. ``ValueError`` for a command of no known form."""
    launcher = []
    if words[:2] == ["accelerate", "launch"]:
        rest = words[2:]
        at = next(i for i, w in enumerate(rest) if w in ("-m", "pretrain"))
        launcher, words = rest[:at], ["python", *(rest[at:] if rest[at] == "-m" else ["-m", *rest[at:]])]
    if words[0] != "python" or len(words) < 2:
        raise ValueError(f"not a command of the project: {shlex.join(words)}")
    if words[1] != "-m":
        return (words[1],), words[2:], launcher
    module = words[2]
    if module in SUBCOMMANDS:
        return ("-m", module, words[3]), words[4:], launcher
    return ("-m", module), words[3:], launcher


def _flags(arguments: list[str]) -> list[str]:
    """The ``--flag`` names among ``arguments`` (optional ones written ``[--flag ...]`` included), up to a ``--`` that
    passes the rest on to another command."""
    flags = []
    for word in arguments:
        word = word.lstrip("[")
        if word == "--":
            break
        if word.startswith("--"):
            flags.append(re.match(r"--[\w-]+", word).group(0))
    return flags


def _helps(programs: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """Each program's ``--help`` output, from one fresh interpreter (this file run as a script); fails the test where a
    program's ``--help`` does not exit 0."""
    import subprocess

    from _launch import subprocess_env

    proc = subprocess.run(
        [sys.executable, __file__, *map(json.dumps, programs)],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {tuple(json.loads(key)): text for key, text in json.loads(proc.stdout.splitlines()[-1]).items()}


def _print_helps(programs: list[tuple[str, ...]]) -> None:
    """Run each program as ``__main__`` with ``--help`` (its arguments parser prints the help and exits 0), the
    ``bench/`` scripts with their folder on ``sys.path`` as ``python SCRIPT`` has it; print one JSON line
    {program as JSON: help}. ``SystemExit`` with a non-zero status for a program whose ``--help`` fails."""
    import contextlib
    import io
    import runpy
    import warnings

    helps = {}
    for program in programs:
        out, argv, path = io.StringIO(), sys.argv, list(sys.path)
        try:
            with contextlib.redirect_stdout(out), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module was imported before
                if program[0] == "-m":
                    sys.argv = [program[1], *program[2:], "--help"]
                    runpy.run_module(program[1], run_name="__main__", alter_sys=True)
                else:
                    script = ROOT / program[0]
                    sys.path.insert(0, str(script.parent))
                    sys.argv = [str(script), "--help"]
                    runpy.run_path(str(script), run_name="__main__")
            raise SystemExit(f"{program}: --help did not exit")
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise SystemExit(f"{program}: --help exited with {stop.code}") from None
        finally:
            sys.argv, sys.path[:] = argv, path
        helps[json.dumps(program)] = out.getvalue()
    print(json.dumps(helps))


def test_every_shown_command_parses():
    """Every command in the bash blocks of the README and the docs/ pages names a program of the project whose
    ``--help`` exits 0 and lists every ``--flag`` the command uses (``accelerate launch``'s own options against
    accelerate's launcher)."""
    shown = []
    for page, words in _shown_commands():
        if any(tuple(words[: len(other)]) == other for other in NOT_OURS):
            continue
        program, arguments, launcher = _program(words)
        shown.append((page, words, program, _flags(arguments)))
        if words[0] == "accelerate":
            shown.append((page, words, ("-m", "accelerate.commands.launch"), _flags(launcher)))
    programs = sorted({program for _, _, program, _ in shown})
    assert ("-m", "pretrain") in programs and ("-m", "finetune.glue") in programs, programs
    helps = _helps(programs)
    unknown = []
    for page, words, program, flags in shown:
        for flag in flags:
            spellings = {flag, "--" + flag[2:].replace("-", "_"), "--" + flag[2:].replace("_", "-")}
            if not any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", helps[program]) for s in spellings):
                unknown.append(f"{page}: {flag} of {shlex.join(words)}")
    assert not unknown, "\n".join(unknown)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces -> ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_a_front_door_that_links_every_page_and_every_link_resolves():
    """The README stays at most 300 lines (issue 53) and links every docs/ page; every relative link of the README
    and the pages names an existing file, and an anchor a heading of its page."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    pages = [p for p in PAGES if p.parent.name == "docs"]
    assert pages and all(f"](docs/{p.name}" in readme for p in pages), [p.name for p in pages]
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            name, _, anchor = target.partition("#")
            linked = (page.parent / name).resolve() if name else page
            if not linked.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", re.sub(r"```.*?```", "", linked.read_text(), flags=re.S), re.M)
                if anchor not in map(_anchor, headings):
                    broken.append(f"{page.name}: {target}")
    assert not broken, broken


def test_ci_runs_the_readme_test_command_verbatim():
    readme_blocks = _bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    test_command = next(b for b in readme_blocks if "pytest" in b)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert test_command in ci_lines, f"README test command {test_command!r} is not a line of .ci/run"


def test_readme_main_job_command_runs_pretrain():
    """The README's first command installs and runs ``accelerate launch [--config_file SHIPPED] pretrain`` with no
    arguments (the design card's main job), any config it names being a file of the project."""
    blocks = _bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    match = re.fullmatch(r"pip install -e \. && accelerate launch (?:--config_file (\S+) )?pretrain", blocks[0])
    assert match, blocks[0]
    assert match.group(1) is None or (ROOT / match.group(1)).is_file(), match.group(1)


def _documents(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n") and not text.endswith("\n\n"), f"{path} must end with a single newline"
    return text[:-1].split("\n\n")


def test_bundled_corpus_is_well_formed_and_disjoint():
    corpus = ROOT / "pretrain" / "corpus"
    train, validation = _documents(corpus / "train.txt.gz"), _documents(corpus / "validation.txt.gz")
    # The counts in pretrain/corpus/README.md.
    assert (len(train), len(validation)) == (525, 4)
    assert sum(len(d.split()) for d in train) == 1_784_176
    assert all(d.strip() == d and d for d in train + validation), "documents are stripped and non-empty"
    assert not set(train) & set(validation), "validation documents must not occur in training"


def test_worker_groups_name_existing_test_modules():
    """Every module of tests/conftest.py's ``WORKER_GROUPS`` exists (a renamed one would silently leave its group and
    make its shared runs once per worker again); a test of a grouped module is in its module's work unit, any other
    test is a unit of its own."""
    from _launch import load_module

    conftest = load_module(ROOT / "tests" / "conftest.py", "sesame_tests_root_conftest")
    assert conftest.WORKER_GROUPS
    for module, group in conftest.WORKER_GROUPS.items():
        assert (ROOT / module).is_file() and module.startswith("tests/") and module.endswith(".py"), module
        assert conftest._group_of(f"{module}::test_anything[param]") == group
    assert conftest._group_of("tests/test_project.py::test_x[1]") == "tests/test_project.py::test_x[1]"
    users = [m for m, g in conftest.WORKER_GROUPS.items() if g == "reference-runs"]
    assert all("reference_runs" in (ROOT / m).read_text() for m in users)  # the group is the fixture's users


if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # the project's packages, not the test folders of the same names (tests/tokenizer/...)
    _print_helps([tuple(json.loads(arg)) for arg in sys.argv[1:]])

"""Project-level checks: CI runs the README's test command, the bundled corpus is well-formed."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks(markdown: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)]


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

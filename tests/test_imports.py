"""The import contract: no import cycles between the project's modules (function-level imports included), and the
layers of ``[tool.importlinter]`` in pyproject.toml (the commands, the tokenizer trainers, the models beside the
training loop, the ground package ``core``) hold -- checked with ``import-linter`` (``lint-imports``, also run by
``.ci/run``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "training", "modeling", "tokenizer", "pretrain", "finetune")


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the strongly connected components of a directed graph ``{node: successors}``;
    a component of more than one node, or a node with an edge to itself, is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in graph:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def test_tarjan_finds_the_cycles_of_a_hand_made_graph():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d"}}
    cycles = sorted(c for c in strongly_connected_components(graph) if len(c) > 1 or c[0] in graph[c[0]])
    assert cycles == [["a", "b", "c"], ["e"]]


def test_no_import_cycles_between_the_projects_modules():
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=True)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = [c for c in strongly_connected_components(edges) if len(c) > 1 or c[0] in edges[c[0]]]
    assert not cycles, cycles


def test_the_import_layers_of_pyproject_hold():
    command = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert command, "import-linter is a test dependency (pip install -e '.[test]')"
    proc = subprocess.run(
        [command, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

"""``pretrain --recipe FILE``: pretraining in phases, as modern encoders are trained (ModernBERT, Ettin, mmBERT:
stable -> context extension -> decay), run by one command.

A recipe is a YAML file::

    max_train_tokens: 2_000_000_000   # optional: the token budget that each phase's share is of
    flags: {optim: stable_adamw}      # optional: flags of every phase (under the phase's own)
    phases:
      - name: stable                  # the phase's folder <output_dir>/<name> and, with --push_to_hub, its branch
        share: 0.85                   # optional: --max_train_tokens = round(share x budget) for this phase
        flags: {max_seq_length: 1024, lr_scheduler_type: constant_with_warmup}   # pretrain flags, without "--"

Each phase is a ``pretrain`` run (:func:`pretrain.cli.main`, in this process) with the command's own flags, then the
recipe's ``flags`` and the phase's over them; its output folder is ``<output_dir>/<name>``; every phase after the first
continues from the previous phase's last checkpoint (``--continue_from_checkpoint``: weights, optimizer state, random
states, data position; :meth:`training.checkpointer.Checkpointer.start_phase`) and uses the first phase's tokenizer
unless a tokenizer is given. A finished phase is recorded in ``<output_dir>/recipe_state.json``; run again after an
interruption, the command skips the finished phases and resumes the interrupted one from its own last checkpoint
(``--resume_from_checkpoint latest``: bitwise the uninterrupted run). With ``--push_to_hub`` each phase's final model is
pushed to ``--hub_model_id`` on the branch named after the phase (``from_pretrained(repo, revision=name)``), as Ettin
publishes its phases.

The command's ``--max_train_tokens`` is the budget when the recipe gives shares (it replaces the recipe's
``max_train_tokens``), so one recipe scales from a demo to a full run. Bad recipe input (not YAML, an unknown key or
flag, a flag the runner sets itself, an empty phase list, a bad value) is one :class:`core.errors.InputError` naming
the file and the field, before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.errors import InputError

logger = logging.getLogger("pretrain")

#: Top-level keys of a recipe, and the keys of one phase.
RECIPE_KEYS = ("max_train_tokens", "flags", "phases")
PHASE_KEYS = ("name", "share", "flags")
#: Flags the runner sets for every phase (refused in a recipe's ``flags``; the command's own ``--output_dir`` is the
#: recipe's folder).
RUNNER_FLAGS = ("output_dir", "continue_from_checkpoint", "resume_from_checkpoint", "hub_revision", "recipe")
#: The recipe's record of its finished phases, in its output folder.
STATE_FILE = "recipe_state.json"
#: A phase name: a folder name and a hub branch name.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclasses.dataclass(frozen=True)
class Phase:
    """One phase of a recipe: its ``name`` (folder and hub branch), its ``pretrain`` flags as arguments (``flags``)
    and its share of the token budget (None: the phase's flags or the command's set its length)."""

    name: str
    flags: tuple[str, ...]
    share: float | None = None


def split_recipe(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(--recipe's value or None, argv without it)``; ``--recipe F`` and ``--recipe=F``.

    Raises:
        InputError: ``--recipe`` without a value.
    """
    rest, recipe, i = [], None, 0
    argv = list(argv)
    while i < len(argv):
        flag, eq, value = argv[i].partition("=")
        if flag == "--recipe":
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise InputError("--recipe: no file given; expected --recipe FILE (a YAML recipe, see recipes/)")
                i, value = i + 1, argv[i + 1]
            recipe = value
        else:
            rest.append(argv[i])
        i += 1
    return recipe, rest


def _flag_args(where: str, name: str, value: Any) -> list[str]:
    """The command-line arguments of one recipe flag ``name: value`` (a scalar; a list: several values; a boolean:
    ``true`` / ``false``)."""
    values = value if isinstance(value, list) else [value]
    if not values or any(v is None or isinstance(v, dict | list) for v in values):
        raise InputError(f"{where}.{name}: {json.dumps(value)[:60]}; expected a value or a list of values")
    return [f"--{name}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]


def load_recipe(path: str | os.PathLike, known_flags: set[str]) -> tuple[int | None, tuple[Phase, ...]]:
    """Read and check the recipe at ``path``: ``(its token budget or None, its phases)``.

    Args:
        known_flags: the flag names ``pretrain`` accepts (without ``--``).

    Raises:
        InputError: one line naming the file and the field: a missing or unreadable file, not YAML, not a mapping,
            an unknown key, no phases, a phase without a valid unique name, an unknown flag or one the runner sets
            (:data:`RUNNER_FLAGS`), a share outside (0, 1], a budget below 1.
    """
    import yaml

    where = f"--recipe {path}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"{where}: cannot be read ({err.strerror or err}); expected a YAML recipe file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        problem = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"{where}: not YAML ({problem}); expected a YAML recipe (see recipes/)") from None
    _check_keys(where, data, RECIPE_KEYS, "phases: [...]")
    budget = data.get("max_train_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise InputError(f"{where}: max_train_tokens {budget!r}; expected an integer >= 1")
    phases = data.get("phases")
    if not isinstance(phases, list) or not phases:
        raise InputError(f"{where}: phases {json.dumps(phases)[:60]}; expected a non-empty list of phases")
    shared = any(isinstance(p, dict) and p.get("share") is not None for p in phases)
    common = _flags(f"{where}: flags", data.get("flags"), known_flags, shared)
    loaded: list[Phase] = []
    for i, phase in enumerate(phases):
        one = _load_phase(f"{where}: phases[{i}]", phase, known_flags, {p.name for p in loaded})
        loaded.append(dataclasses.replace(one, flags=(*common, *one.flags)))
    return budget, tuple(loaded)


def _check_keys(where: str, value: Any, keys: Sequence[str], what: str) -> None:
    """Refuse a recipe's mapping (``where``: its field) that is not a mapping or has a key not in ``keys``."""
    if not isinstance(value, dict):
        shown = "a list" if isinstance(value, list) else json.dumps(value, default=str)[:60]
        raise InputError(f"{where}: {shown}; expected a mapping with {what}")
    for key in value:
        if key not in keys:
            raise InputError(f"{where}: unknown key {key!r}; expected {', '.join(keys)}")


def _load_phase(where: str, phase: Any, known_flags: set[str], taken: set[str]) -> Phase:
    _check_keys(where, phase, PHASE_KEYS, "name and flags")
    name = phase.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name) or name in taken:
        raise InputError(
            f"{where}.name: {json.dumps(name)}; expected a unique name of letters, digits, '.', '_', '-' (its folder "
            "and hub branch)"
        )
    share = phase.get("share")
    if share is not None and (
        isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1 or not math.isfinite(share)
    ):
        raise InputError(f"{where}.share: {share!r}; expected a share of the token budget in (0, 1]")
    args = _flags(f"{where}.flags", phase.get("flags"), known_flags, share is not None)
    return Phase(name, tuple(args), None if share is None else float(share))


#: The flags that set a run's length: a phase with a share of the budget takes none of them.
LENGTH_FLAGS = ("max_train_tokens", "max_train_steps", "num_train_epochs", "time_budget")


def _flags(where: str, flags: Any, known_flags: set[str], shared: bool) -> list[str]:
    """The command-line arguments of a recipe's ``flags`` mapping (``where``: its field, for the error line).

    Raises:
        InputError: not a mapping, an unknown flag, a flag of :data:`RUNNER_FLAGS`, a length flag with a share
            (``shared``), a value that is not a scalar or a list of scalars.
    """
    flags = {} if flags is None else flags
    if not isinstance(flags, dict):
        raise InputError(f"{where}: {json.dumps(flags)[:60]}; expected a mapping of pretrain flags to values")
    args: list[str] = []
    for flag, value in flags.items():
        if flag in RUNNER_FLAGS:
            raise InputError(f"{where}.{flag}: set by --recipe for each phase; expected it left out")
        if flag not in known_flags:
            raise InputError(f"{where}.{flag}: not a pretrain flag; expected one of `pretrain --help`'s")
        if shared and flag in LENGTH_FLAGS:
            raise InputError(f"{where}.{flag}: conflicts with share; expected one way to set the phase's length")
        args += _flag_args(where, flag, value)
    return args


def _given(argv: Sequence[str], *flags: str) -> bool:
    return any(a == f"--{f}" or a.startswith(f"--{f}=") for a in argv for f in flags)


def _without(argv: Sequence[str], flag: str) -> tuple[list[str], str | None]:
    """``argv`` without ``--flag VALUE`` / ``--flag=VALUE``, and the value (None: not given)."""
    rest, value, i = [], None, 0
    while i < len(argv):
        name, eq, tail = argv[i].partition("=")
        if name == f"--{flag}":
            if eq:
                value = tail
            elif i + 1 < len(argv):
                i, value = i + 1, argv[i + 1]
        else:
            rest.append(argv[i])
        i += 1
    return rest, value


def phase_commands(
    recipe: str | os.PathLike, argv: Sequence[str], parse: Callable[[list[str]], Any], known_flags: set[str]
) -> tuple[str, list[tuple[Phase, list[str]]]]:
    """The recipe's output folder and, per phase, its ``pretrain`` arguments without the runner's (the command's
    ``argv`` without ``--output_dir`` and a budget that the recipe's shares divide, the phase's ``--max_train_tokens``
    and flags, ``--output_dir <folder>/<name>``), each checked by ``parse`` (``pretrain.cli.parse``; nothing is
    written); ``known_flags`` are ``pretrain``'s flag names (``pretrain.cli.known_flags``), which a phase may set.

    Raises:
        InputError: a bad recipe (:func:`load_recipe`), ``--hub_revision`` on the command (the runner names the
            branches), ``--push_to_hub`` without ``--hub_model_id``, shares without a budget, or a phase whose
            arguments ``parse`` refuses (the line names the phase).
    """
    budget, phases = load_recipe(recipe, known_flags)
    where = f"--recipe {recipe}"
    for flag in RUNNER_FLAGS:
        if flag != "output_dir" and _given(argv, flag):
            raise InputError(f"{where}: --{flag} is set by the recipe for each phase; expected it left out")
    base, output_dir = _without(argv, "output_dir")
    if any(p.share is not None for p in phases):
        base, given_budget = _without(base, "max_train_tokens")
        if given_budget is not None:
            try:
                budget = int(float(given_budget))
            except ValueError:
                raise InputError(f"--max_train_tokens {given_budget}: expected an integer >= 1") from None
        if budget is None or budget < 1:
            raise InputError(
                f"{where}: phases have a share and there is no token budget; expected max_train_tokens in the recipe "
                "or --max_train_tokens N"
            )
    output_dir = output_dir or parse(base).training.output_dir
    commands = []
    for phase in phases:
        args = [*base, *phase.flags, "--output_dir", os.path.join(output_dir, phase.name)]
        if phase.share is not None:
            args += ["--max_train_tokens", str(max(1, round(phase.share * budget)))]
        try:
            plan = parse(args)
        except InputError as err:
            raise InputError(f"{where}: phase {phase.name}: {err}") from None
        if plan.hub.push_to_hub and not plan.hub.hub_model_id:
            raise InputError(
                f"{where}: --push_to_hub without --hub_model_id; expected --hub_model_id (one repo, a branch per phase)"
            )
        commands.append((phase, args))
    return output_dir, commands


def _read_state(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"finished": {}}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable ({err}); expected the recipe's JSON record of finished phases") from None
    return state if isinstance(state, dict) and isinstance(state.get("finished"), dict) else {"finished": {}}


def run_recipe(
    recipe: str | os.PathLike,
    argv: Sequence[str],
    main: Callable[[list[str]], int | None],
    parse: Callable[[list[str]], Any],
    known_flags: set[str],
) -> int:
    """Run the recipe's phases in turn with ``main`` (``pretrain``'s), skipping those recorded as finished in
    ``<output_dir>/recipe_state.json`` and resuming an interrupted one (see the module docstring). Returns the exit
    status: 0, or the first phase's that is not 0 (e.g. 143 after SIGTERM; run the command again to resume).
    ``parse`` and ``known_flags``: as :func:`phase_commands` takes them (``pretrain.cli`` passes its own, so that this
    module does not import the command line that imports it).

    Raises:
        InputError: a bad recipe or phase arguments (before anything is written), or a phase's own refusal.
    """
    from core.logs import setup_logging
    from training.accelerator import keep_process_group

    output_dir, commands = phase_commands(recipe, argv, parse, known_flags)
    setup_logging(int(os.environ.get("RANK", "0")) == 0)
    tokenizer_given = _given(argv, "tokenizer_name", "model_name_or_path", "prepared_dataset")
    with keep_process_group():  # one process group for all the phases (a second rendezvous would fail)
        status = _run_phases(recipe, output_dir, commands, main, parse, tokenizer_given)
    if status == 0:
        logger.info("recipe %s: %d phases finished in %s", recipe, len(commands), output_dir)
    return status


def _run_phases(recipe, output_dir: str, commands, main, parse, tokenizer_given: bool) -> int:
    """The phases of :func:`run_recipe`, in turn; the exit status (0, or the first phase's that is not 0)."""
    from accelerate.state import AcceleratorState, GradientState

    from core.files import write_text_atomic
    from training.checkpoint_files import checkpoint_dirs, resolve_checkpoint

    state_path = Path(output_dir) / STATE_FILE
    state = _read_state(state_path)
    previous: str | None = None
    for i, (phase, args) in enumerate(commands):
        folder = Path(output_dir) / phase.name
        label = f"recipe {recipe}: phase {i + 1}/{len(commands)} {phase.name}"
        if phase.name in state["finished"]:
            previous = state["finished"][phase.name]["checkpoint"]
            logger.info("%s: finished (%s), skipped", label, previous)
            continue
        run = list(args)
        if previous is not None:
            run += ["--continue_from_checkpoint", previous]
            if not tokenizer_given:  # the first phase's tokenizer (trained by it), not a new one
                run += ["--tokenizer_name", os.path.join(output_dir, commands[0][0].name)]
        if parse(run).hub.push_to_hub:
            run += ["--hub_revision", phase.name]
        saved = checkpoint_dirs(folder / "checkpoints") if (folder / "checkpoints").is_dir() else []
        if saved:
            run += ["--resume_from_checkpoint", "latest"]
            what = f"resumes inside the phase ({len(saved)} checkpoints in {folder / 'checkpoints'})"
        else:
            if folder.exists():  # stopped before its first checkpoint: the folder holds nothing to keep
                run += ["--overwrite_output_dir"]
            what = f"starts from {previous}" if previous else "starts"
        logger.info("%s: %s", label, what)
        AcceleratorState._reset_state()  # each phase makes its accelerator (keep_process_group: the same group)
        GradientState._reset_state()
        status = main(run)
        if status not in (None, 0):
            return int(status)
        previous = str(resolve_checkpoint("latest", folder / "checkpoints"))
        state["finished"][phase.name] = {"checkpoint": previous}
        if int(os.environ.get("RANK", "0")) == 0:
            write_text_atomic(state_path, json.dumps(state, indent=2) + "\n")
    return 0


__all__ = [
    "PHASE_KEYS",
    "RECIPE_KEYS",
    "RUNNER_FLAGS",
    "STATE_FILE",
    "Phase",
    "load_recipe",
    "phase_commands",
    "run_recipe",
    "split_recipe",
]

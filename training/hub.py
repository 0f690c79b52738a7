"""Pushing a run's model directory to a model hub (huggingface.co or a self-hosted Hub-compatible server).

The product side of ``--push_to_hub``: :class:`HubArguments` declares the flags of the Hugging Face example
scripts, :func:`validate_hub_arguments` checks them (and the token) before training starts, :func:`push_output_dir`
(or :class:`HubPusher`, which remembers the settings) uploads a ``save_pretrained`` directory as one commit.
Only standard ``huggingface_hub`` calls are used: ``whoami``, ``create_repo(exist_ok=True, private=...)``,
``list_repo_refs``, ``create_branch``, ``list_repo_files`` and ``create_commit``.

Which hub: ``HF_ENDPOINT`` (default ``https://huggingface.co``), read by ``huggingface_hub`` at import time.
A self-hosted Hub-compatible server without Xet storage needs ``HF_HUB_DISABLE_XET=1`` (large files then go
through Git LFS); the error says so when it is missing.
Which token: ``--hub_token``, else ``HF_TOKEN``, else the one stored by ``hf auth login``.

What is pushed: the regular files of the output directory (a symbolic link is refused, naming it: it may point
at a private file outside the folder), except checkpoints and pickles -- ``config.json``,
``*.safetensors`` (+ index), tokenizer files, the model code referenced by ``auto_map`` (``*.py``),
``all_results.json`` and the generated ``README.md`` (model card). Never ``checkpoints/`` (accelerate
states), ``*.bin`` / ``*.pt`` / ``*.pkl`` (pickles), optimizer or RNG states. Remote weight files that the
new push does not contain (e.g. ``model.safetensors`` after a switch to shards) are deleted in the same commit,
so the repo never mixes weights of two pushes.

Interrupted pushes: a push is ONE commit. Large files go to the LFS store first (``preupload`` + LFS batch
upload); then a single ``commit`` call moves the branch, and the Hub applies a commit atomically. A push
interrupted midway (network loss, Ctrl-C, a crash) therefore leaves the branch at its last complete commit,
never at a half-pushed model; the error says which commit the remote keeps. Re-running the push resumes:
LFS objects already uploaded are not sent again. (``upload_folder`` is not used on purpose: with ``hf_xet``
installed it may split a folder over several commits.)

Errors for refused input raise :class:`core.errors.InputError` naming the repo / revision and what to do:
no token, an invalid token, a token without write access, a missing repo or revision, a revision that is a
tag or a commit (not a branch), an interrupted push.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

from core.arguments import HelpFormatter, arg, parser_class, split_secrets, with_defaults
from core.errors import InputError, add_debug_argument, first_line

logger = logging.getLogger(__name__)

#: Folder inside ``output_dir`` where ``--hub_strategy every_save`` writes a checkpoint's model for its push.
STAGING_DIR = ".hub-staging"

#: Never pushed: accelerate checkpoints, pickled weights / states, caches, temporary files.
DEFAULT_IGNORE_PATTERNS = (
    "checkpoints/*",
    "checkpoint-*/*",
    "step_*/*",
    "runs/*",
    "wandb/*",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.pkl",
    "*.pickle",
    "*.ckpt",
    "*.npy",
    "*.npz",
    "optimizer*",
    "scheduler*",
    "rng_state*",
    "random_states*",
    "training_args*",
    "*.lock",
    "*.tmp",
    "*.incomplete",
    "__pycache__/*",
    "*.pyc",
    ".*",
)
#: Weight files of a ``save_pretrained`` directory (deleted remotely when a push no longer has them).
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json")
HUB_STRATEGIES = ("end", "every_save")
_TOKEN_URL = "https://huggingface.co/settings/tokens"


@dataclasses.dataclass(frozen=True)
class HubArguments:
    """``--push_to_hub --hub_model_id --hub_token --hub_private_repo --hub_revision --hub_strategy``: names and
    meanings of the Hugging Face example scripts / ``TrainingArguments``."""

    _argument_group_name: ClassVar[str] = "model hub (HF_ENDPOINT, default https://huggingface.co)"

    push_to_hub: bool = arg(False, "push the final model (and the model card) to a repo on the hub")
    hub_model_id: str | None = arg(
        None, "repo id 'namespace/name' (default: the token's user and the --output_dir name)"
    )
    hub_token: str | None = arg(None, "token with write access (default: HF_TOKEN, then the token of `hf auth login`)")
    hub_private_repo: bool = arg(False, "create the repo as private")
    hub_revision: str | None = arg(None, "branch to push to (created from main when missing; default: main)")
    hub_strategy: str = arg(
        "end",
        "'end': push once after training; 'every_save': also push the model at every "
        "--checkpointing_steps checkpoint as a commit 'Training in progress (step N)' (a failed "
        "one only warns)",
        choices=list(HUB_STRATEGIES),
    )


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _http_status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


@contextlib.contextmanager
def hub_errors(repo_id: str | None, revision: str | None = None, action: str = "push") -> Iterator[None]:
    """Turn ``huggingface_hub`` errors into :class:`InputError` naming the repo, revision and the remedy.

    Raises:
        InputError: no token, an invalid token (401), no write access (403), a missing repo or revision.
        Other errors (network, 5xx) pass through unchanged.
    """
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalTokenNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = (
        (f"{repo_id!r}" if repo_id else "a repo")
        + (f" (revision {revision!r})" if revision else "")
        + f" on {_endpoint()}"
    )
    try:
        yield
    except LocalTokenNotFoundError:
        raise InputError(
            f"--push_to_hub: no token to {action} {where}; pass --hub_token, set HF_TOKEN or run "
            f"`hf auth login` with a token that has write access ({_TOKEN_URL})"
        ) from None
    except RevisionNotFoundError:
        raise InputError(
            f"--hub_revision: revision {revision!r} not found in {repo_id!r} on {_endpoint()}; "
            f"name an existing branch, tag or commit"
        ) from None
    except RepositoryNotFoundError:
        raise InputError(
            f"--hub_model_id: repository {repo_id!r} not found on {_endpoint()} (or it is private and the token "
            f"has no access to it); check the repo id and pass a token of its owner with --hub_token / HF_TOKEN"
        ) from None
    except HfHubHTTPError as err:
        status = _http_status(err)
        server = (getattr(err, "server_message", None) or "").strip()
        if status == 401:
            raise InputError(
                f"--hub_token: the hub refused the token while trying to {action} {where} "
                f"(401 {server or 'Unauthorized'}); the token is invalid, expired or missing -- create one "
                f"with write access at {_TOKEN_URL} and pass it with --hub_token or HF_TOKEN"
            ) from None
        if status == 403:
            raise InputError(
                f"--hub_token: the token has no write access to {where} (403 {server or 'Forbidden'}); "
                f"use a token with the 'write' role for the namespace {repo_id.split('/')[0]!r} "
                f"({_TOKEN_URL})"
            ) from None
        raise


def _resolve_token(token: str | None) -> str:
    from huggingface_hub import get_token
    from huggingface_hub.errors import LocalTokenNotFoundError

    token = token or get_token()
    if not token:
        raise LocalTokenNotFoundError("no token")
    return token


def _whoami(token: str, repo_id: str | None) -> dict:
    """``whoami`` with a readable error for an invalid token; checks the role of classic tokens."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().whoami(token=token)
    except HfHubHTTPError as err:
        if _http_status(err) == 401:
            target = f" to push to {repo_id!r}" if repo_id else ""
            raise InputError(
                f"--hub_token: the token was refused by {_endpoint()}{target} (invalid or expired); create a token "
                f"with write access at {_TOKEN_URL} and pass it with --hub_token or HF_TOKEN"
            ) from None
        raise
    role = ((info.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise InputError(
            f"--hub_token: the token of user {info.get('name')!r} is read-only; pushing to "
            f"{repr(repo_id) if repo_id else 'the hub'} needs a token with the 'write' role ({_TOKEN_URL})"
        )
    return info


def default_repo_id(output_dir: str | os.PathLike, user: str) -> str:
    """Repo id derived as transformers does: the token's user and the ``output_dir`` folder name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(output_dir).resolve().name).strip("-.") or "model"
    name = re.sub(r"-{2,}", "-", name).replace("..", ".")
    return f"{user}/{name[:96]}"


def validate_hub_arguments(
    hub: HubArguments, output_dir: str | os.PathLike | None = None, check_remote: bool = True
) -> HubArguments:
    """Check the hub flags before training (fail in seconds, not after hours); returns them with the repo id
    resolved.

    Without ``--push_to_hub`` nothing is checked. With it: the token must exist and (``check_remote``) be
    accepted by the hub with write access to the repo's namespace (the user or one of its organizations);
    a missing ``--hub_model_id`` becomes ``<user>/<output_dir name>``, a bare name ``<user>/<name>``;
    the repo id must be valid; ``--hub_revision`` must be a branch name. ``check_remote=False`` skips every
    network call (then ``--hub_model_id`` must be given in full).

    Raises:
        InputError: for any of the above, naming the flag and what to do.
    """
    if not hub.push_to_hub:
        return hub
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if hub.hub_strategy not in HUB_STRATEGIES:
        raise InputError(f"--hub_strategy {hub.hub_strategy!r}: expected one of {', '.join(HUB_STRATEGIES)}")
    revision = hub.hub_revision
    if revision is not None and (
        re.fullmatch(r"[0-9a-f]{40}", revision)
        or not re.fullmatch(r"[A-Za-z0-9._/-]+", revision)
        or revision.startswith(("/", "-", "refs/"))
        or ".." in revision
    ):
        raise InputError(f"--hub_revision {revision!r}: expected a branch name such as 'dev' or 'run-2'")
    repo_id = hub.hub_model_id
    if check_remote:
        with hub_errors(repo_id, revision, "push to"):
            token = _resolve_token(hub.hub_token)
        info = _whoami(token, repo_id)
        user = info.get("name")
        if repo_id is None:
            if not output_dir:
                raise InputError("--push_to_hub: give --hub_model_id (or --output_dir to derive the repo name from)")
            repo_id = default_repo_id(output_dir, user)
        elif "/" not in repo_id:
            repo_id = f"{user}/{repo_id}"
    elif repo_id is None or "/" not in repo_id:
        raise InputError(f"--hub_model_id {repo_id!r}: expected 'namespace/name'")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise InputError(f"--hub_model_id {repo_id!r}: not a valid repo id ({err})") from None
    if check_remote:
        namespaces = {user, *(org.get("name") for org in info.get("orgs") or [])}
        if repo_id.split("/")[0] not in namespaces:
            raise InputError(
                f"--hub_model_id {repo_id!r}: the token of user {user!r} cannot push to the namespace "
                f"{repo_id.split('/')[0]!r} (its namespaces: {', '.join(sorted(n for n in namespaces if n))}); "
                f"use a repo id in one of them or a token of that namespace"
            )
    return dataclasses.replace(hub, hub_model_id=repo_id)


def prepare_repo(repo_id: str, token: str | None = None, private: bool = False, revision: str | None = None) -> str:
    """Create the repo (if missing) and the branch ``revision`` (from ``main``, if missing).

    Returns:
        The commit id the branch points to now.

    Raises:
        InputError: no / invalid / read-only token, no access, ``revision`` is a tag or a commit.
    """
    from huggingface_hub import HfApi

    api = HfApi()
    branch = revision or "main"
    with hub_errors(repo_id, revision, "create"):
        token = _resolve_token(token)
        api.create_repo(repo_id, token=token, private=private, exist_ok=True)
        refs = api.list_repo_refs(repo_id, token=token)
        heads = {ref.name: ref.target_commit for ref in refs.branches}
        if branch in heads:
            return heads[branch]
        if branch in {ref.name for ref in refs.tags}:
            raise InputError(
                f"--hub_revision {branch!r} is a tag of {repo_id!r}; pushes go to a branch -- "
                f"name a new or existing branch"
            )
        api.create_branch(repo_id, branch=branch, token=token, exist_ok=True)
        refs = api.list_repo_refs(repo_id, token=token)
        return {ref.name: ref.target_commit for ref in refs.branches}[branch]


def _local_files(folder: Path, allow_patterns, ignore_patterns) -> list[str]:
    """The regular files under ``folder`` (relative POSIX paths) that the patterns select; links are not followed.

    Raises:
        InputError: a selected entry is a symbolic link (to a file or a folder): its content may lie outside the
            folder (a private file), so the push is refused naming the links.
    """
    from huggingface_hub.utils import filter_repo_objects

    files, links = [], []
    for dirpath, dirnames, filenames in os.walk(folder):  # os.walk does not descend into linked folders
        base = Path(dirpath)
        for name in (*dirnames, *filenames):
            entry = base / name
            rel = entry.relative_to(folder).as_posix()
            if entry.is_symlink():
                links.append(rel)
            elif name in filenames and entry.is_file():
                files.append(rel)
    files = list(filter_repo_objects(sorted(files), allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
    links = list(filter_repo_objects(sorted(links), allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
    if links:
        raise InputError(
            f"--output_dir {folder}: symbolic links are not pushed (their content may lie outside the "
            f"folder): {', '.join(links)}; expected regular files (copy them in, or remove the links)"
        )
    return files


def push_output_dir(
    output_dir: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload model",
    model_card: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    ignore_patterns: Sequence[str] = DEFAULT_IGNORE_PATTERNS,
) -> str:
    """Push a ``save_pretrained`` directory to ``repo_id`` (branch ``revision``) as one atomic commit.

    Creates the repo (``private`` only matters then) and the branch when missing, uploads the files (LFS
    objects first), deletes remote weight files the directory no longer has, and commits once.

    Args:
        output_dir: the directory (``config.json``, ``*.safetensors``, tokenizer files, model code, ...).
        repo_id: ``"namespace/name"``.
        token: a token with write access; None = ``HF_TOKEN`` or the stored login.
        private: create the repo as private (ignored when it exists).
        revision: branch to commit to (None = ``main``); created from ``main`` when missing.
        commit_message: e.g. ``"Upload model (step 1000)"``.
        model_card: README.md text to commit (replaces any README.md in ``output_dir``).
        allow_patterns / ignore_patterns: ``fnmatch`` patterns over paths relative to ``output_dir``
            (``*`` crosses ``/``); the default ignores checkpoints and pickles.

    Returns:
        The commit URL (a ``huggingface_hub.CommitInfo``, a ``str``; ``.oid`` is the commit id).

    Raises:
        InputError: missing directory or nothing to push; no / invalid / read-only token; a missing repo or
            revision; a tag as ``revision``; a push interrupted midway (the message names the commit the
            remote keeps -- commits are atomic, so nothing of the failed push is visible).
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    folder = Path(output_dir)
    if not folder.is_dir():
        raise InputError(f"--output_dir {str(folder)!r}: not a directory; nothing to push to {repo_id!r}")
    files = _local_files(folder, allow_patterns, list(ignore_patterns))
    if model_card is not None:
        files = [f for f in files if f != "README.md"]
    if not files:
        raise InputError(
            f"--output_dir {str(folder)!r}: no files to push to {repo_id!r} after the patterns "
            f"(ignored: {', '.join(ignore_patterns)})"
        )
    branch = revision or "main"
    before = prepare_repo(repo_id, token=token, private=private, revision=revision)
    token = _resolve_token(token)
    api = HfApi()
    operations = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(folder / f)) for f in files]
    if model_card is not None:
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=model_card.encode("utf-8")))
    with hub_errors(repo_id, revision, "push to"):
        from huggingface_hub.utils import filter_repo_objects

        remote = api.list_repo_files(repo_id, revision=branch, token=token)
        stale = set(filter_repo_objects(remote, allow_patterns=list(WEIGHT_PATTERNS))) - set(files)
        operations += [CommitOperationDelete(path_in_repo=p) for p in sorted(stale)]
        try:
            return api.create_commit(
                repo_id, operations=operations, commit_message=commit_message, revision=branch, token=token
            )
        except ValueError:  # InputError, or README metadata refused by the hub (a bug of the card)
            raise
        except Exception as err:  # network loss, server error: say what the remote holds now
            if _http_status(err) in (401, 403, 404):
                raise  # refused input: hub_errors explains it
            if "xet-write-token" in str(err) and not os.environ.get("HF_HUB_DISABLE_XET"):
                raise InputError(
                    f"the hub at {_endpoint()} does not offer Xet storage, which huggingface_hub uses for large "
                    f"files when hf_xet is installed; set HF_HUB_DISABLE_XET=1 in the environment to upload them "
                    f"through Git LFS instead (nothing was committed to {repo_id!r})"
                ) from err
            raise InputError(_interrupted_message(api, repo_id, branch, token, before, err)) from err


def _interrupted_message(api, repo_id: str, branch: str, token: str, before: str, err: BaseException) -> str:
    head = "the push to {!r} (branch {!r}) was interrupted: {}: {}".format(
        repo_id, branch, type(err).__name__, str(err).splitlines()[0].rstrip(".") if str(err) else ""
    )
    try:
        now = {r.name: r.target_commit for r in api.list_repo_refs(repo_id, token=token).branches}.get(branch)
    except Exception:  # the hub may be unreachable now
        now = None
    if now == before:
        state = f"nothing was committed: the remote keeps its last complete commit {before}"
    elif now is not None:
        state = f"the commit went through before the connection failed: the branch is now at {now}"
    else:
        state = (
            f"the hub could not be asked again; commits are atomic, so the branch holds either its last "
            f"complete commit {before} or the whole new commit, never part of it"
        )
    return f"{head}; {state}. Re-run the push to retry (LFS files already uploaded are not sent again)."


@dataclasses.dataclass(eq=False)
class HubPusher:
    """The hub settings of one run, for the training loop: ``prepare()`` once, then ``push(...)``.

    ``push`` is called at the end of training, and also after every checkpoint save with
    ``--hub_strategy every_save`` (see :meth:`should_push_on_save`).
    """

    repo_id: str
    token: str | None = dataclasses.field(default=None, repr=False)  # a secret: never in a repr or log
    private: bool = False
    revision: str | None = None
    strategy: str = "end"

    @classmethod
    def from_arguments(cls, hub: HubArguments) -> HubPusher | None:
        """None without ``--push_to_hub``; ``hub`` must come from :func:`validate_hub_arguments` (repo id
        resolved)."""
        if not hub.push_to_hub:
            return None
        if not hub.hub_model_id:
            raise InputError("--push_to_hub: --hub_model_id is not set; call validate_hub_arguments(hub) first")
        return cls(hub.hub_model_id, hub.hub_token, hub.hub_private_repo, hub.hub_revision, hub.hub_strategy)

    @property
    def should_push_on_save(self) -> bool:
        return self.strategy == "every_save"

    def prepare(self) -> str:
        """Create the repo / branch now (before training); returns the branch's current commit id."""
        return prepare_repo(self.repo_id, token=self.token, private=self.private, revision=self.revision)

    def push(
        self,
        output_dir: str | os.PathLike,
        step: int | None = None,
        model_card: str | None = None,
        final: bool = True,
        commit_message: str | None = None,
    ) -> str:
        """Push ``output_dir``; message ``commit_message``, by default ``"Upload model (step N)"`` (``"Training in
        progress (step N)"`` when ``final`` is False). Returns the commit URL (``.oid`` = commit id)."""
        what = "Upload model" if final else "Training in progress"
        message = commit_message or what + (f" (step {step})" if step is not None else "")
        return push_output_dir(
            output_dir,
            self.repo_id,
            token=self.token,
            private=self.private,
            revision=self.revision,
            commit_message=message,
            model_card=model_card,
        )

    def push_checkpoint(
        self, output_dir: str | os.PathLike, step: int, model, tokenizer=None, state_dict=None, model_card=None
    ) -> str | None:
        """``--hub_strategy every_save``: push the model of a checkpoint mid-training (main process only).

        ``model.save_pretrained`` (with ``state_dict`` when given, e.g. from ``accelerator.get_state_dict``)
        and ``tokenizer.save_pretrained`` go into ``<output_dir>/.hub-staging`` (ignored by the final push),
        which is pushed as one commit ``"Training in progress (step N)"`` and removed. ``model_card`` is a
        string or a callable ``(staging_dir) -> str`` (a card failure only skips the card).

        A failed push does not stop training: a warning names the repo, the step and the cause, and None is
        returned (the final push at the end still raises). Returns the commit URL otherwise.
        """
        staging = Path(output_dir) / STAGING_DIR
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.mkdir(parents=True)
            model.save_pretrained(staging, state_dict=state_dict)
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
            card = model_card
            if callable(model_card):
                try:
                    card = model_card(staging)
                except (ImportError, InputError) as err:
                    logger.warning("no model card for the push of step %d: %s", step, err)
                    card = None
            url = self.push(staging, step=step, model_card=card, final=False)
            logger.info("pushed step %d to %s (%s)", step, self.repo_id, url)
            return url
        except Exception as err:  # noqa: BLE001  (network, hub, disk: training goes on)
            first = first_line(err)
            logger.warning(
                "--hub_strategy every_save: the push of step %d to %r (branch %r) failed, training "
                "continues (the final push is still made): %s: %s",
                step,
                self.repo_id,
                self.revision or "main",
                type(err).__name__,
                first,
            )
            return None
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def every_save_hook(
    pusher: HubPusher | None, output_dir: str | os.PathLike, tokenizer, model_card: Callable[[Path], str] | None = None
) -> Callable | None:
    """The ``Trainer(on_save=...)`` hook of ``--hub_strategy every_save`` (None otherwise, or without a pusher).

    The hook ``(trainer, step)`` runs on every process after each periodic checkpoint:
    ``accelerator.get_state_dict`` on all ranks (FSDP gathers the shards), then on the main process
    :meth:`HubPusher.push_checkpoint` of the model, ``tokenizer`` and the card ``model_card(staging folder)``
    into ``output_dir``'s staging folder.
    """
    if pusher is None or not pusher.should_push_on_save:
        return None

    def on_save(trainer, step: int) -> None:
        state_dict = trainer.accelerator.get_state_dict(trainer.eager_model)  # not the compiled wrapper's keys
        if trainer.accelerator.is_main_process:
            pusher.push_checkpoint(output_dir, step, trainer.unwrapped_model, tokenizer, state_dict, model_card)

    return on_save


@dataclasses.dataclass(frozen=True)
class PushArguments:
    """``python -m training.hub push``: the folder and the commit's title; the repo flags are :class:`HubArguments`'
    (its ``push_to_hub`` and ``hub_strategy`` hidden: they do not apply to one push)."""

    output_dir: str = arg(help="the run's --output_dir", positional=True)
    commit_message: str = arg("Upload model", "the commit's title")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m training.hub push OUTPUT_DIR [--hub_model_id REPO] [--hub_revision BRANCH] [--hub_private_repo]``:
    push a saved output folder (its ``README.md`` as the model card) as one commit, e.g. after a final push that
    failed. The token comes from ``--hub_token``, ``HF_TOKEN`` or ``hf auth login``.

    Raises:
        InputError: as :func:`validate_hub_arguments` and :func:`push_output_dir`.
    """
    import argparse
    import sys

    repo = with_defaults(HubArguments, help=dict.fromkeys(("push_to_hub", "hub_strategy"), argparse.SUPPRESS))
    parser = argparse.ArgumentParser(prog="python -m training.hub", description="Push a saved model folder to a hub.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=parser_class())
    push = commands.add_parser(
        "push",
        dataclass_types=[PushArguments, repo],
        formatter_class=HelpFormatter,
        help="push OUTPUT_DIR (model, tokenizer, README.md, all_results.json) as one "
        "commit; never checkpoints or pickles",
    )
    add_debug_argument(push)
    namespace = parser.parse_args(argv)
    sys.argv[:] = split_secrets(sys.argv)[0]
    args, given = ({f.name: getattr(namespace, f.name) for f in dataclasses.fields(t)} for t in (PushArguments, repo))
    hub = validate_hub_arguments(HubArguments(**{**given, "push_to_hub": True}), args["output_dir"])
    options = dict(private=hub.hub_private_repo, revision=hub.hub_revision, commit_message=args["commit_message"])
    print(push_output_dir(args["output_dir"], hub.hub_model_id, **options))
    return 0


__all__ = [
    "DEFAULT_IGNORE_PATTERNS",
    "HUB_STRATEGIES",
    "STAGING_DIR",
    "HubArguments",
    "HubPusher",
    "PushArguments",
    "default_repo_id",
    "every_save_hook",
    "hub_errors",
    "main",
    "prepare_repo",
    "push_output_dir",
    "validate_hub_arguments",
]


if __name__ == "__main__":
    import sys

    from core.errors import run_cli

    sys.exit(run_cli(main))

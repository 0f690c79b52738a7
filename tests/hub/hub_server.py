"""A small Hub-API-compatible HTTP server for tests: what the real ``huggingface_hub`` client needs.

The server speaks the subset of the Hugging Face Hub HTTP API that ``huggingface_hub`` (2.x, with
``HF_HUB_DISABLE_XET=1``) and ``transformers`` use to create repos, push commits and load files:

==================================================  ==============================================
route                                               client call
==================================================  ==============================================
``GET  /api/whoami-v2``                             ``whoami``
``POST /api/repos/create``                          ``create_repo`` (``private``, ``exist_ok``)
``POST /api/validate-yaml``                         commit of a ``README.md`` (metadata check)
``GET  /api/models/{repo}[/revision/{rev}]``        ``model_info`` / ``repo_info`` (siblings, sha)
``GET  /api/models/{repo}/refs``                    ``list_repo_refs``
``POST|DELETE /api/models/{repo}/branch/{name}``    ``create_branch`` / ``delete_branch``
``POST /api/models/{repo}/tag/{rev}``               ``create_tag``; ``DELETE .../tag/{name}``
``GET  /api/models/{repo}/tree/{rev}[/{path}]``     ``list_repo_tree`` / ``list_repo_files``
``POST /api/models/{repo}/paths-info/{rev}``        ``get_paths_info`` / ``file_exists``
``GET  /api/models/{repo}/commits/{rev}``           ``list_repo_commits``
``POST /api/models/{repo}/preupload/{rev}``         upload mode of each file: "regular" or "lfs"
``POST /{repo}.git/info/lfs/objects/batch``         Git LFS batch API (basic transfer)
``POST /api/models/{repo}/commit/{rev}``            ``create_commit`` (NDJSON body), atomic
``HEAD|GET /{repo}/resolve/{rev}/{path}``           ``hf_hub_download`` (by branch, tag or sha)
==================================================  ==============================================

Large files (LFS) live in a second server on another port that plays the object store (S3 / CDN):
the batch API answers with a signed ``PUT`` URL there and a ``verify`` URL on the Hub; ``resolve`` of an
LFS file answers ``302`` with ``Location`` on the store plus ``X-Linked-Etag`` (sha256) and
``X-Linked-Size``, so the client takes the metadata from the redirect and downloads from the store
without its ``Authorization`` header, as it does against huggingface.co.

Repos are kept in memory: a commit is a snapshot ``{path: oid}`` over a content-addressed blob store;
branches and tags are refs to commit ids (40 hex digits). A commit builds the whole new snapshot
before it moves the branch, under a lock, so readers see the old or the new commit, never half of one.

Auth: ``Authorization: Bearer <token>`` with tokens given to :class:`HubServer` (``{token: (user, role)}``,
role ``"write"`` or ``"read"``). Private repos answer ``401`` (no token) / ``404`` (a token without
access) with ``X-Error-Code: RepoNotFound``, as the Hub does; an unknown token answers ``401``
``Invalid credentials in Authorization header``; a token without write access answers ``403``.

Only the standard library is used (``http.server``). PyYAML, when importable, validates README metadata.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

#: Files the preupload endpoint sends to LFS by name, as the Hub's default ``.gitattributes`` does.
LFS_PATTERNS = (
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.h5",
    "*.msgpack",
    "*.onnx",
    "*.npy",
    "*.npz",
    "*.pkl",
    "*.pickle",
    "*.gz",
    "*.zip",
    "*.tar",
    "*.arrow",
    "*.parquet",
    "*.model",
    "*.ot",
    "*tfevents*",
)
#: Files larger than this go through LFS whatever their name (the Hub uses 10 MB).
DEFAULT_LFS_THRESHOLD = 10 * 1024 * 1024
_REF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,99}$")
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


def git_blob_sha1(data: bytes) -> str:
    """Git object id of a blob: ``sha1(b"blob <len>\\0" + data)`` (hex, 40 chars)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256_hex: str, size: int) -> bytes:
    """The Git LFS pointer file that git stores in place of an LFS object."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256_hex}\nsize {size}\n".encode()


@dataclass
class Blob:
    """One file version. ``lfs`` files are stored by sha256 in the object store."""

    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        """Git blob id: of the content (regular) or of the LFS pointer (LFS)."""
        return git_blob_sha1(lfs_pointer(self.sha256, len(self.data)) if self.lfs else self.data)

    @property
    def etag(self) -> str:
        """What the Hub sends as (linked) ETag: sha256 for LFS files, git blob id otherwise."""
        return self.sha256 if self.lfs else self.git_oid


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    description: str
    files: dict[str, Blob]
    author: str
    date: float


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def resolve(self, revision: str) -> Commit | None:
        """Commit named by a branch, a tag, or a (full or >= 7-digit abbreviated) commit id."""
        if revision in self.branches:
            return self.commits[self.branches[revision]]
        if revision in self.tags:
            return self.commits[self.tags[revision]]
        if re.fullmatch(r"[0-9a-f]{7,40}", revision):
            hits = [c for oid, c in self.commits.items() if oid.startswith(revision)]
            if len(hits) == 1:
                return hits[0]
        return None


class HubError(Exception):
    """An HTTP error answer: status, the ``X-Error-Code`` header (or None) and a message."""

    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict | None = None, body: dict | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.body = body or {}


class HubState:
    """Repos, refs, blobs and tokens shared by the Hub and the object-store servers."""

    def __init__(self, tokens: dict[str, tuple[str, str]], lfs_threshold: int = DEFAULT_LFS_THRESHOLD):
        self.tokens = dict(tokens)
        self.lfs_threshold = lfs_threshold
        self.repos: dict[str, Repo] = {}
        self.lfs_store: dict[str, bytes] = {}  # sha256 -> bytes
        self.lock = threading.RLock()
        self.secret = secrets.token_bytes(16)
        self.hub_url = ""  # set once the servers are bound
        self.store_url = ""
        self.requests: list[tuple[str, str]] = []  # (method, path) log, for tests
        #: fault injection: ``{repo_id: n}`` drops the connection of the next n commit calls of that repo
        #: after reading them (the client sees the connection die; nothing is committed).
        self.drop_commits: dict[str, int] = {}

    # -- auth -----------------------------------------------------------------------------------
    def user_of(self, authorization: str | None) -> tuple[str, str] | None:
        """``(user, role)`` of the bearer token, None without one; an unknown token is a 401."""
        if not authorization:
            return None
        token = authorization.split(" ", 1)[1].strip() if " " in authorization else authorization.strip()
        if token not in self.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.tokens[token]

    def get_repo(self, repo_id: str, who: tuple[str, str] | None) -> Repo:
        """The repo if ``who`` may read it; else 401 (anonymous) / 404 (authenticated), code RepoNotFound."""
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and (who is None or who[0] != repo_id.split("/")[0])):
            raise HubError(401 if who is None else 404, "Repository not found", "RepoNotFound")
        return repo

    def check_write(self, repo_id: str, who: tuple[str, str] | None) -> None:
        """403 unless ``who`` holds a write token of the repo's namespace (401 without any token)."""
        if who is None:
            raise HubError(401, "You must be authenticated with a write token to write to this repository")
        user, role = who
        if role != "write":
            raise HubError(403, f"The token of user '{user}' is read-only; a token with write access is needed")
        if user != repo_id.split("/")[0]:
            raise HubError(403, f"User '{user}' has no write access to namespace '{repo_id.split('/')[0]}'")

    # -- commits --------------------------------------------------------------------------------
    def new_commit(
        self, repo: Repo, parent: str | None, title: str, description: str, files: dict[str, Blob], author: str
    ) -> Commit:
        now = time.time()
        digest = hashlib.sha1()
        for part in (repo.repo_id, parent or "", title, description, repr(now), secrets.token_hex(4)):
            digest.update(part.encode() + b"\0")
        for path in sorted(files):
            digest.update(f"{path}\0{files[path].git_oid}\n".encode())
        commit = Commit(digest.hexdigest(), parent, title, description, dict(files), author, now)
        repo.commits[commit.oid] = commit
        return commit

    def upload_mode(self, path: str, size: int, sample: bytes) -> str:
        name = path.rsplit("/", 1)[-1]
        if size > 0 and (size >= self.lfs_threshold or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)):
            return "lfs"
        return "regular"

    def sign(self, what: str) -> str:
        return hmac.new(self.secret, what.encode(), hashlib.sha256).hexdigest()[:32]


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def _card_metadata(files: dict[str, Blob]) -> dict | None:
    """YAML front matter of README.md, as the Hub returns it in ``cardData`` (None when absent)."""
    blob = files.get("README.md")
    if blob is None:
        return None
    text = blob.data.decode("utf-8", "replace")
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n", text, re.S)
    if not match:
        return None
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML ships with huggingface_hub's dependencies
        return None
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


class _Handler(BaseHTTPRequestHandler):
    """Common plumbing: body reading (Content-Length or chunked), JSON / error answers."""

    protocol_version = "HTTP/1.1"
    timeout = 60  # idle keep-alive connections end their thread after this many seconds
    state: HubState  # set on the subclass made per server

    def log_message(self, format, *args):  # noqa: A002 - quiet by default
        if os.environ.get("HUB_SERVER_LOG"):
            super().log_message(format, *args)

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send(
        self, status: int, body: bytes = b"", headers: dict | None = None, content_type: str = "application/json"
    ) -> None:
        self.send_response(status)
        headers = dict(headers or {})
        if body or content_type:
            headers.setdefault("Content-Type", content_type)
        headers.setdefault("Content-Length", str(len(body)))
        if self.close_connection:  # say so (RFC 9112 9.6): a client that pools the connection would race its close
            headers["Connection"] = "close"
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def send_json(self, status: int, obj, headers: dict | None = None) -> None:
        self.send(status, json.dumps(obj).encode(), headers)

    def send_error_answer(self, err: HubError) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self.send_json(err.status, {"error": err.message, **err.body}, headers)

    def send_content(self, data: bytes, headers: dict) -> None:
        """Answer with ``data``, honouring a ``Range: bytes=a-[b]`` request header (206)."""
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "").strip())
        headers = {"Accept-Ranges": "bytes", **headers}
        if match and self.command == "GET":
            start = int(match.group(1))
            end = int(match.group(2)) if match.group(2) else len(data) - 1
            if start >= len(data):
                raise HubError(
                    416, "Requested range not satisfiable", headers={"Content-Range": f"bytes */{len(data)}"}
                )
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self.send(206, data[start : end + 1], headers, content_type="application/octet-stream")
            return
        self.send(200, data, headers, content_type="application/octet-stream")

    def dispatch(self) -> None:
        with self.state.lock:
            self.state.requests.append((self.command, self.path))
        try:
            self.route()
        except HubError as err:
            if self.command not in ("GET", "HEAD"):
                self.close_connection = True  # the request body may be unread
            self.send_error_answer(err)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = lambda self: self.dispatch()  # noqa: E731

    def route(self) -> None:  # pragma: no cover - overridden
        raise HubError(404, "Not found")


class StoreHandler(_Handler):
    """The object store (S3 / CDN): signed ``PUT /upload/{oid}`` and ``GET /lfs/{oid}``; no Hub auth."""

    def route(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        parts = url.path.strip("/").split("/")
        if len(parts) != 2 or parts[0] not in ("upload", "lfs"):
            raise HubError(404, "Not found")
        kind, oid = parts
        if query.get("sig") != self.state.sign(f"{kind}:{oid}"):
            raise HubError(403, "Signature does not match")
        if kind == "upload" and self.command == "PUT":
            data = self.read_body()
            if hashlib.sha256(data).hexdigest() != oid:
                raise HubError(400, f"Uploaded content does not match sha256 {oid}")
            with self.state.lock:
                self.state.lfs_store[oid] = data
            self.send(200, b"", {"ETag": f'"{hashlib.md5(data).hexdigest()}"'}, content_type="")
            return
        if kind == "lfs" and self.command in ("GET", "HEAD"):
            with self.state.lock:
                data = self.state.lfs_store.get(oid)
            if data is None:
                raise HubError(404, "No such object")
            self.send_content(data, {"ETag": f'"{oid}"'})
            return
        raise HubError(405, "Method not allowed")


class HubHandler(_Handler):
    """The Hub itself: JSON API, LFS batch API and ``resolve``."""

    # -- helpers ---------------------------------------------------------------------------------
    def who(self) -> tuple[str, str] | None:
        return self.state.user_of(self.headers.get("Authorization"))

    def json_body(self) -> dict:
        body = self.read_body()
        try:
            return json.loads(body or b"{}")
        except json.JSONDecodeError as err:
            raise HubError(400, f"Invalid JSON body: {err}") from None

    def repo_url(self, repo_id: str) -> str:
        return f"{self.state.hub_url}/{repo_id}"

    def commit_for(self, repo: Repo, revision: str) -> Commit:
        commit = repo.resolve(revision)
        if commit is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit

    # -- routing ---------------------------------------------------------------------------------
    def route(self) -> None:
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        raw = [p for p in url.path.split("/") if p != ""]
        seg = [unquote(p) for p in raw]
        if seg[:1] == ["api"]:
            return self.route_api(seg[1:], raw[1:])
        if len(seg) >= 3 and seg[1].endswith(".git") and seg[2:] == ["info", "lfs", "objects", "batch"]:
            return self.lfs_batch(f"{seg[0]}/{seg[1][:-4]}")
        if len(seg) >= 4 and seg[2] == "resolve" and self.command in ("GET", "HEAD"):
            return self.resolve(f"{seg[0]}/{seg[1]}", seg[3], unquote("/".join(raw[4:])))
        raise HubError(404, "Not found")

    def route_api(self, seg: list[str], raw: list[str]) -> None:
        cmd = self.command
        if seg == ["whoami-v2"] and cmd == "GET":
            return self.whoami()
        if seg == ["repos", "create"] and cmd == "POST":
            return self.create_repo()
        if seg == ["repos", "delete"] and cmd == "DELETE":
            return self.delete_repo()
        if seg == ["validate-yaml"] and cmd == "POST":
            return self.validate_yaml()
        if len(seg) < 3 or seg[0] != "models":
            raise HubError(404, f"Not found: /api/{'/'.join(seg)}")
        repo_id, rest, raw_rest = f"{seg[1]}/{seg[2]}", seg[3:], raw[3:]
        if not rest and cmd == "GET":
            return self.model_info(repo_id, None)
        action, args = rest[0], rest[1:]
        if action == "revision" and len(args) == 1 and cmd == "GET":
            return self.model_info(repo_id, args[0])
        if action == "refs" and not args and cmd == "GET":
            return self.list_refs(repo_id)
        if action in ("branch", "tag") and len(args) == 1 and cmd in ("POST", "DELETE"):
            return self.ref(repo_id, action, args[0])
        if action == "tree" and len(args) >= 1 and cmd == "GET":
            return self.tree(repo_id, args[0], unquote("/".join(raw_rest[2:])))
        if action == "paths-info" and len(args) == 1 and cmd == "POST":
            return self.paths_info(repo_id, args[0])
        if action == "commits" and len(args) == 1 and cmd == "GET":
            return self.list_commits(repo_id, args[0])
        if action == "preupload" and len(args) == 1 and cmd == "POST":
            return self.preupload(repo_id, args[0])
        if action == "commit" and len(args) == 1 and cmd == "POST":
            return self.commit(repo_id, args[0])
        if action == "lfs-verify" and len(args) == 1 and cmd == "POST":
            return self.lfs_verify(repo_id, args[0])
        raise HubError(404, f"Not found: /api/{'/'.join(seg)}")

    # -- users and repos ---------------------------------------------------------------------------
    def whoami(self) -> None:
        who = self.who()
        if who is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        user, role = who
        self.send_json(
            200,
            {
                "type": "user",
                "id": hashlib.md5(user.encode()).hexdigest()[:24],
                "name": user,
                "fullname": user,
                "orgs": [],
                "isPro": False,
                "auth": {"type": "access_token", "accessToken": {"displayName": f"{user}-{role}", "role": role}},
            },
        )

    def create_repo(self) -> None:
        who = self.who()
        body = self.json_body()
        if body.get("type", "model") not in (None, "model"):
            raise HubError(400, "This test server only hosts model repos")
        if who is None:
            raise HubError(401, "You must be authenticated to create a repo")
        namespace = body.get("organization") or who[0]
        name = body.get("name") or ""
        if not (_REPO_PART.match(namespace) and _REPO_PART.match(name)) or "--" in name or ".." in name:
            raise HubError(400, f"Invalid repo name: {namespace}/{name}")
        repo_id = f"{namespace}/{name}"
        self.state.check_write(repo_id, who)
        private = body.get("visibility") == "private" or bool(body.get("private"))
        with self.state.lock:
            if repo_id in self.state.repos:
                raise HubError(409, "You already created this model repo", body={"url": self.repo_url(repo_id)})
            repo = Repo(repo_id, private)
            gitattributes = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS)
            commit = self.state.new_commit(
                repo, None, "initial commit", "", {".gitattributes": Blob(gitattributes.encode(), False)}, who[0]
            )
            repo.branches["main"] = commit.oid
            self.state.repos[repo_id] = repo
        self.send_json(200, {"url": self.repo_url(repo_id), "name": repo_id, "id": repo_id})

    def delete_repo(self) -> None:
        who = self.who()
        body = self.json_body()
        repo_id = f"{body.get('organization') or (who[0] if who else '')}/{body.get('name')}"
        self.state.get_repo(repo_id, who)
        self.state.check_write(repo_id, who)
        with self.state.lock:
            self.state.repos.pop(repo_id, None)
        self.send_json(200, {})

    def validate_yaml(self) -> None:
        self.who()
        content = self.json_body().get("content", "")
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.S)
        errors = []
        if match:
            import yaml

            try:
                data = yaml.safe_load(match.group(1))
                if data is not None and not isinstance(data, dict):
                    errors.append({"message": "metadata must be a YAML mapping"})
            except yaml.YAMLError as err:
                errors.append({"message": f"invalid YAML: {err}"})
        if errors:
            self.send_json(400, {"errors": errors, "warnings": []})
        else:
            self.send_json(200, {"errors": [], "warnings": []})

    def model_info(self, repo_id: str, revision: str | None) -> None:
        who = self.who()
        with self.state.lock:
            repo = self.state.get_repo(repo_id, who)
            commit = self.commit_for(repo, revision or "main")
        blobs = self.query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for path in sorted(commit.files):
            blob = commit.files[path]
            entry = {"rfilename": path}
            if blobs:
                entry.update(size=len(blob.data), blobId=blob.git_oid)
                if blob.lfs:
                    entry["lfs"] = {
                        "size": len(blob.data),
                        "sha256": blob.sha256,
                        "pointerSize": len(lfs_pointer(blob.sha256, len(blob.data))),
                    }
            siblings.append(entry)
        card = _card_metadata(commit.files) or {}
        config = None
        if "config.json" in commit.files:
            try:
                config = json.loads(commit.files["config.json"].data)
            except ValueError:
                config = None
        tags = list(card.get("tags") or []) if isinstance(card.get("tags"), list) else []
        if card.get("library_name"):
            tags.insert(0, card["library_name"])
        info = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit.oid,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "lastModified": _iso(commit.date),
            "createdAt": _iso(repo.created),
            "tags": tags,
            "library_name": card.get("library_name"),
            "pipeline_tag": card.get("pipeline_tag"),
            "siblings": siblings,
            "spaces": [],
        }
        if card:
            info["cardData"] = card
            if "model-index" in card:
                info["model-index"] = card["model-index"]
        if config is not None:
            info["config"] = {k: config[k] for k in ("architectures", "model_type", "auto_map") if k in config}
        self.send_json(200, info)

    # -- refs ------------------------------------------------------------------------------------
    def list_refs(self, repo_id: str) -> None:
        with self.state.lock:
            repo = self.state.get_repo(repo_id, self.who())
            branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": c} for n, c in repo.branches.items()]
            tags = [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": c} for n, c in repo.tags.items()]
        self.send_json(200, {"branches": branches, "converts": [], "tags": tags, "pullRequests": []})

    def ref(self, repo_id: str, kind: str, arg: str) -> None:
        """``POST|DELETE .../branch/{name}`` (body: startingPoint) and ``.../tag/{rev}`` (body: tag)."""
        who = self.who()
        body = self.json_body() if self.command == "POST" else {}
        with self.state.lock:
            repo = self.state.get_repo(repo_id, who)
            self.state.check_write(repo_id, who)
            refs = repo.branches if kind == "branch" else repo.tags
            if self.command == "DELETE":
                if arg not in refs:
                    raise HubError(404, f"Invalid rev id: {arg}", "RevisionNotFound")
                if kind == "branch" and arg == "main":
                    raise HubError(403, "Cannot delete the default branch")
                del refs[arg]
                return self.send_json(200, {})
            name = arg if kind == "branch" else str(body.get("tag") or "")
            if not _REF_NAME.match(name) or _SHA1.match(name) or name.endswith((".lock", "/")) or ".." in name:
                raise HubError(400, f"Invalid {kind} name: {name!r}")
            if name in repo.branches or name in repo.tags:
                raise HubError(409, f"Reference already exists: {name}")
            start = body.get("startingPoint") or "main" if kind == "branch" else arg
            refs[name] = self.commit_for(repo, start).oid
        self.send_json(200, {})

    # -- listing ---------------------------------------------------------------------------------
    def _entry(self, path: str, blob: Blob | None) -> dict:
        if blob is None:
            return {"type": "directory", "oid": git_blob_sha1(path.encode()), "size": 0, "path": path}
        entry = {"type": "file", "oid": blob.git_oid, "size": len(blob.data), "path": path}
        if blob.lfs:
            entry["lfs"] = {
                "oid": blob.sha256,
                "size": len(blob.data),
                "pointerSize": len(lfs_pointer(blob.sha256, len(blob.data))),
            }
        return entry

    def tree(self, repo_id: str, revision: str, prefix: str) -> None:
        with self.state.lock:
            commit = self.commit_for(self.state.get_repo(repo_id, self.who()), revision)
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = prefix.strip("/")
        base = f"{prefix}/" if prefix else ""
        under = sorted(p for p in commit.files if p.startswith(base))
        if prefix and not under:
            raise HubError(404, f"Entry not found: {prefix}", "EntryNotFound", headers={"X-Repo-Commit": commit.oid})
        entries, dirs = [], set()
        for path in under:
            rel = path[len(base) :].split("/")
            for depth in range(1, len(rel)):
                folder = base + "/".join(rel[:depth])
                if (recursive or depth == 1) and folder not in dirs:
                    dirs.add(folder)
                    entries.append(self._entry(folder, None))
            if recursive or len(rel) == 1:
                entries.append(self._entry(path, commit.files[path]))
        self.send_json(200, entries)

    def paths_info(self, repo_id: str, revision: str) -> None:
        body = self.read_body().decode()
        form = (
            parse_qs(body)
            if not body.startswith("{")
            else {k: (v if isinstance(v, list) else [v]) for k, v in json.loads(body).items()}
        )
        with self.state.lock:
            commit = self.commit_for(self.state.get_repo(repo_id, self.who()), revision)
        out = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in commit.files:
                out.append(self._entry(path, commit.files[path]))
            elif any(p.startswith(path + "/") for p in commit.files):
                out.append(self._entry(path, None))
        self.send_json(200, out)

    def list_commits(self, repo_id: str, revision: str) -> None:
        with self.state.lock:
            repo = self.state.get_repo(repo_id, self.who())
            commit = self.commit_for(repo, revision)
            out = []
            while commit is not None:
                out.append(
                    {
                        "id": commit.oid,
                        "title": commit.title,
                        "message": commit.description,
                        "authors": [{"user": commit.author}],
                        "date": _iso(commit.date),
                    }
                )
                commit = repo.commits.get(commit.parent) if commit.parent else None
        self.send_json(200, out)

    # -- uploads ---------------------------------------------------------------------------------
    def writable_branch(self, repo_id: str, revision: str, who) -> tuple[Repo, Commit]:
        repo = self.state.get_repo(repo_id, who)
        self.state.check_write(repo_id, who)
        if revision not in repo.branches:
            if repo.resolve(revision) is not None:
                raise HubError(400, f"Cannot commit to {revision}: not a branch (create a branch first)")
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo, repo.commits[repo.branches[revision]]

    def preupload(self, repo_id: str, revision: str) -> None:
        who = self.who()
        body = self.json_body()
        with self.state.lock:
            _, head = self.writable_branch(repo_id, revision, who)
        files = []
        for f in body.get("files", []):
            mode = self.state.upload_mode(f["path"], int(f.get("size", 0)), base64.b64decode(f.get("sample", "")))
            existing = head.files.get(f["path"])
            oid = None
            if existing is not None:
                oid = existing.sha256 if existing.lfs else existing.git_oid
            files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self.send_json(200, {"files": files, "commitOid": head.oid})

    def lfs_batch(self, repo_id: str) -> None:
        who = self.who()
        body = self.json_body()
        with self.state.lock:
            self.state.get_repo(repo_id, who)
            if body.get("operation") == "upload":
                self.state.check_write(repo_id, who)
            store = dict(self.state.lfs_store)
        if body.get("operation") not in ("upload", "download"):
            raise HubError(400, "operation must be upload or download")
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj.get("oid", ""), obj.get("size")
            if not re.fullmatch(r"[0-9a-f]{64}", oid) or not isinstance(size, int):
                objects.append(
                    {"oid": str(oid), "size": int(size or 0), "error": {"code": 422, "message": "invalid oid or size"}}
                )
                continue
            item = {"oid": oid, "size": size, "authenticated": True}
            if body["operation"] == "upload" and oid not in store:
                item["actions"] = {
                    "upload": {"href": f"{self.state.store_url}/upload/{oid}?sig={self.state.sign('upload:' + oid)}"},
                    "verify": {"href": f"{self.state.hub_url}/api/models/{repo_id}/lfs-verify/{oid}"},
                }
            elif body["operation"] == "download":
                if oid not in store:
                    item["error"] = {"code": 404, "message": "Object does not exist"}
                else:
                    item["actions"] = {
                        "download": {"href": f"{self.state.store_url}/lfs/{oid}?sig={self.state.sign('lfs:' + oid)}"}
                    }
            objects.append(item)
        self.send(
            200,
            json.dumps({"transfer": "basic", "objects": objects}).encode(),
            content_type="application/vnd.git-lfs+json",
        )

    def lfs_verify(self, repo_id: str, oid: str) -> None:
        who = self.who()
        body = self.json_body()
        with self.state.lock:
            self.state.get_repo(repo_id, who)
            self.state.check_write(repo_id, who)
            data = self.state.lfs_store.get(oid)
        if data is None or body.get("oid") != oid or body.get("size") != len(data):
            raise HubError(404, f"LFS object {oid} not uploaded (or size mismatch)")
        self.send_json(200, {"success": True})

    def commit(self, repo_id: str, revision: str) -> None:
        who = self.who()
        body = self.read_body()
        with self.state.lock:
            drop = self.state.drop_commits.get(repo_id, 0)
            if drop:
                self.state.drop_commits[repo_id] = drop - 1
        if drop:  # simulate a connection lost mid-push: no answer, no commit
            self.close_connection = True
            return
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The first NDJSON line must be the commit header")
        header = lines[0]["value"]
        if not header.get("summary"):
            raise HubError(400, "Commit summary (message) is empty")
        with self.state.lock:
            repo, head = self.writable_branch(repo_id, revision, who)
            if header.get("parentCommit") and repo.resolve(header["parentCommit"]) is not head:
                raise HubError(412, f"A commit has happened since {header['parentCommit']}; parent is {head.oid}")
            files = dict(head.files)
            for line in lines[1:]:
                key, value = line.get("key"), line.get("value", {})
                path = value.get("path", "").strip("/")
                if key == "file":
                    data = (
                        base64.b64decode(value["content"])
                        if value.get("encoding") == "base64"
                        else value["content"].encode()
                    )
                    files[path] = Blob(data, False)
                elif key == "lfsFile":
                    data = self.state.lfs_store.get(value.get("oid", ""))
                    if data is None:
                        raise HubError(422, f"LFS object of {path} ({value.get('oid')}) was never uploaded")
                    if value.get("size") is not None and value["size"] != len(data):
                        raise HubError(422, f"LFS object of {path} has size {len(data)}, not {value['size']}")
                    files[path] = Blob(data, True)
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del files[path]
                elif key == "deletedFolder":
                    gone = [p for p in files if p.startswith(path + "/")]
                    if not gone:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for p in gone:
                        del files[p]
                else:
                    raise HubError(400, f"Unknown commit operation: {key}")
            commit = self.state.new_commit(
                repo, head.oid, header["summary"], header.get("description", ""), files, who[0]
            )
            repo.branches[revision] = commit.oid  # the one atomic step: move the branch
        self.send_json(
            200,
            {
                "success": True,
                "commitOid": commit.oid,
                "pullRequestUrl": None,
                "commitUrl": f"{self.repo_url(repo_id)}/commit/{commit.oid}",
            },
        )

    # -- downloads -------------------------------------------------------------------------------
    def resolve(self, repo_id: str, revision: str, path: str) -> None:
        who = self.who()
        with self.state.lock:
            repo = self.state.get_repo(repo_id, who)
            commit = self.commit_for(repo, revision)
        blob = commit.files.get(path)
        base = {"X-Repo-Commit": commit.oid}
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", headers=base)
        if blob.lfs:
            sha = blob.sha256
            location = f"{self.state.store_url}/lfs/{sha}?sig={self.state.sign('lfs:' + sha)}"
            self.send(
                302,
                b"",
                {
                    **base,
                    "Location": location,
                    "ETag": f'"{blob.git_oid}"',
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(len(blob.data)),
                },
                content_type="",
            )
            return
        self.send_content(blob.data, {**base, "ETag": f'"{blob.git_oid}"'})


class HubServer:
    """A Hub on ``http://127.0.0.1:<port>`` (port chosen by the OS) and its object store, in threads.

    Args:
        tokens: ``{token: (user, role)}``, role ``"write"`` or ``"read"``.
        lfs_threshold: files at least this large (bytes) go through LFS whatever their name.

    Use as a context manager or call :meth:`start` / :meth:`stop` (idempotent).
    """

    def __init__(self, tokens: dict[str, tuple[str, str]], lfs_threshold: int = DEFAULT_LFS_THRESHOLD):
        self.state = HubState(tokens, lfs_threshold)
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        self.url = ""

    def start(self) -> HubServer:
        for handler in (HubHandler, StoreHandler):
            cls = type(handler.__name__, (handler,), {"state": self.state})
            server = ThreadingHTTPServer(("127.0.0.1", 0), cls)
            server.daemon_threads = True
            self._servers.append(server)
        hub, store = self._servers
        self.url = self.state.hub_url = f"http://127.0.0.1:{hub.server_address[1]}"
        self.state.store_url = f"http://127.0.0.1:{store.server_address[1]}"
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop serving, close the listening sockets and join the serving threads."""
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)
        self._servers, self._threads = [], []

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- direct inspection for tests (no HTTP) ---------------------------------------------------
    def repo(self, repo_id: str) -> Repo:
        return self.state.repos[repo_id]

    def file_at(self, repo_id: str, revision: str, path: str) -> bytes:
        with self.state.lock:
            commit = self.state.repos[repo_id].resolve(revision)
            return commit.files[path].data

    def is_lfs(self, repo_id: str, revision: str, path: str) -> bool:
        with self.state.lock:
            return self.state.repos[repo_id].resolve(revision).files[path].lfs


def main(argv: list[str] | None = None) -> None:
    """Run the server by hand: ``python tests/hub/hub_server.py --token hf_x:alice:write``."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token", action="append", default=[], metavar="TOKEN:USER:ROLE")
    args = parser.parse_args(argv)
    tokens = {t.split(":")[0]: (t.split(":")[1], t.split(":")[2]) for t in args.token}
    with HubServer(tokens) as server:
        print(f"HF_ENDPOINT={server.url} HF_HUB_DISABLE_XET=1  (Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

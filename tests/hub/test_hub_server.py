"""The test Hub against the real ``huggingface_hub`` client (in a subprocess, HF_ENDPOINT = the server).

Checks the protocol end to end: repo creation, the preupload decision (regular vs LFS), LFS batch + upload
+ verify on the object store, the NDJSON commit, refs (branches, tags), model_info, listing, downloads by
branch / tag / commit id, and the auth answers the client turns into its typed errors.
"""

from __future__ import annotations

import hashlib
import os


def test_client_round_trip_refs_and_lfs(hub, tmp_path):
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    weights = os.urandom(70_000)
    (folder / "model.safetensors").write_bytes(weights)  # LFS by name
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "sub" / "notes.txt").write_text("regular file in a folder")
    out = hub.run(
        f"""
        import json, os
        from huggingface_hub import HfApi, hf_hub_download, snapshot_download
        api = HfApi()
        me = api.whoami()
        url = api.create_repo("alice/tiny")
        again = api.create_repo("alice/tiny", exist_ok=True)
        c1 = api.upload_folder(repo_id="alice/tiny", folder_path={str(folder)!r},
                               commit_message="Upload model (step 1)")
        info = api.model_info("alice/tiny", files_metadata=True)
        api.create_branch("alice/tiny", branch="dev")
        api.create_tag("alice/tiny", tag="v1", revision="main")
        api.upload_file(path_or_fileobj=b"dev only", path_in_repo="dev.txt", repo_id="alice/tiny",
                        revision="dev", commit_message="dev change")
        refs = api.list_repo_refs("alice/tiny")
        def get(rev, name):
            return open(hf_hub_download("alice/tiny", name, revision=rev), "rb").read()
        import hashlib
        digest = lambda b: hashlib.sha256(b).hexdigest()
        res = {{
            "user": me["name"], "url": str(url), "again": str(again),
            "c1": c1.oid, "c1_url": str(c1), "info_sha": info.sha, "private": info.private,
            "siblings": {{s.rfilename: [s.size, s.lfs["sha256"] if s.lfs else None] for s in info.siblings}},
            "branches": {{b.name: b.target_commit for b in refs.branches}},
            "tags": {{t.name: t.target_commit for t in refs.tags}},
            "weights_by_tag": digest(get("v1", "model.safetensors")),
            "weights_by_sha": digest(get(c1.oid, "model.safetensors")),
            "notes_by_sha": get(c1.oid[:12], "sub/notes.txt").decode(),
            "dev_by_branch": get("dev", "dev.txt").decode(),
            "main_files": sorted(api.list_repo_files("alice/tiny")),
            "dev_files": sorted(api.list_repo_files("alice/tiny", revision="dev")),
            "top_level": sorted([e.path, type(e).__name__] for e in api.list_repo_tree("alice/tiny")),
            "exists": [api.file_exists("alice/tiny", "config.json"), api.file_exists("alice/tiny", "nope.txt")],
        }}
        snap = snapshot_download("alice/tiny", revision="dev")
        res["snapshot"] = sorted(os.path.relpath(os.path.join(d, f), snap) for d, _, fs in os.walk(snap) for f in fs)
        res["commits"] = [c.title for c in api.list_repo_commits("alice/tiny", revision="dev")]
        c_noop = api.upload_folder(repo_id="alice/tiny", folder_path={str(folder)!r}, commit_message="same files")
        res["noop_sha"] = c_noop.oid
        print(json.dumps(res))
    """,
        tmp_path / "home",
        token=hub.write_token,
    )

    assert out["user"] == "alice"
    assert out["url"] == out["again"] == f"{hub.url}/alice/tiny"
    assert out["c1_url"] == f"{hub.url}/alice/tiny/commit/{out['c1']}"
    # the commit id the client got is the one model_info, refs and the server's own branch report
    assert out["info_sha"] == out["c1"] == out["tags"]["v1"] == hub.server.repo("alice/tiny").branches["main"]
    assert out["branches"]["main"] == out["c1"] != out["branches"]["dev"]
    assert out["private"] is False
    sha = hashlib.sha256(weights).hexdigest()
    assert out["siblings"]["model.safetensors"] == [len(weights), sha]
    assert out["siblings"]["config.json"] == [len('{"hidden_size": 8}'), None]
    # *.safetensors went through the LFS batch API to the object store; small text files did not
    assert hub.server.is_lfs("alice/tiny", "main", "model.safetensors")
    assert not hub.server.is_lfs("alice/tiny", "main", "config.json")
    puts = [p for m, p in hub.server.state.requests if m == "PUT"]
    assert len(puts) == 1 and sha in puts[0]
    assert out["weights_by_tag"] == out["weights_by_sha"] == sha
    assert out["notes_by_sha"] == "regular file in a folder"  # abbreviated commit id resolves too
    assert out["dev_by_branch"] == "dev only"
    assert "dev.txt" in out["dev_files"] and "dev.txt" not in out["main_files"]
    assert out["main_files"] == [".gitattributes", "config.json", "model.safetensors", "sub/notes.txt"]
    assert out["top_level"] == [
        [".gitattributes", "RepoFile"],
        ["config.json", "RepoFile"],
        ["model.safetensors", "RepoFile"],
        ["sub", "RepoFolder"],
    ]
    assert out["exists"] == [True, False]
    assert out["snapshot"] == [".gitattributes", "config.json", "dev.txt", "model.safetensors", "sub/notes.txt"]
    assert out["commits"] == ["dev change", "Upload model (step 1)", "initial commit"]  # newest first
    assert out["noop_sha"] == out["c1"]  # unchanged files: the client skips the empty commit


def test_client_auth_errors(hub, tmp_path):
    """Private repos are invisible without their owner's token; bad and read-only tokens are refused."""
    out = hub.run(
        f"""
        import json
        from huggingface_hub import HfApi, hf_hub_download
        from huggingface_hub.errors import (HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError,
                                            EntryNotFoundError)
        owner, anon = HfApi(token={hub.write_token!r}), HfApi(token=False)
        owner.create_repo("alice/secret", private=True)
        owner.upload_file(path_or_fileobj=b"{{}}", path_in_repo="config.json", repo_id="alice/secret",
                          commit_message="add config")
        owner.create_repo("alice/public")
        res = {{}}
        def outcome(key, fn):
            try:
                fn()
                res[key] = "ok"
            except Exception as err:
                status = getattr(getattr(err, "response", None), "status_code", None)
                res[key] = [type(err).__name__, status, str(err)]
        outcome("anon_info", lambda: anon.model_info("alice/secret"))
        outcome("anon_download", lambda: hf_hub_download("alice/secret", "config.json", token=False))
        outcome("bob_info", lambda: HfApi(token={hub.other_token!r}).model_info("alice/secret"))
        outcome("reader_info", lambda: HfApi(token={hub.read_token!r}).model_info("alice/secret"))
        outcome("owner_download", lambda: hf_hub_download("alice/secret", "config.json", token={hub.write_token!r}))
        outcome("wrong_token", lambda: hf_hub_download("alice/public", ".gitattributes", token="hf_wrong"))
        outcome("wrong_whoami", lambda: HfApi(token="hf_wrong").whoami())
        outcome("read_only_commit", lambda: HfApi(token={hub.read_token!r}).upload_file(
            path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="alice/public", commit_message="nope"))
        outcome("read_only_create", lambda: HfApi(token={hub.read_token!r}).create_repo("alice/new"))
        outcome("bob_commit", lambda: HfApi(token={hub.other_token!r}).upload_file(
            path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="alice/public", commit_message="nope"))
        outcome("missing_revision", lambda: hf_hub_download("alice/public", ".gitattributes", revision="nope"))
        outcome("missing_file", lambda: hf_hub_download("alice/public", "nope.json"))
        outcome("missing_repo", lambda: owner.model_info("alice/does-not-exist"))
        outcome("tag_of_missing_rev", lambda: owner.create_tag("alice/public", tag="t", revision="nope"))
        print(json.dumps(res))
    """,
        tmp_path / "home",
    )

    for key in ("anon_info", "anon_download", "bob_info"):
        assert out[key][0] == "RepositoryNotFoundError", (key, out[key])
    assert out["anon_info"][1] == 401 and out["bob_info"][1] == 404  # as the Hub: 401 anonymous, 404 with a token
    assert out["reader_info"] == "ok" and out["owner_download"] == "ok"  # the owner's read token sees it
    assert out["wrong_token"][1] == 401 and "Invalid credentials in Authorization header" in out["wrong_token"][2]
    assert out["wrong_whoami"][1] == 401 and "Invalid user token" in out["wrong_whoami"][2]
    for key in ("read_only_commit", "read_only_create", "bob_commit"):
        assert out[key][0] == "HfHubHTTPError" and out[key][1] == 403, (key, out[key])
    assert "read-only" in out["read_only_commit"][2]
    assert out["missing_revision"][0] == "RevisionNotFoundError"
    assert out["missing_file"][0] == "RemoteEntryNotFoundError"
    assert out["missing_repo"][0] == "RepositoryNotFoundError"
    assert out["tag_of_missing_rev"][0] == "RevisionNotFoundError"
    assert hub.server.repo("alice/secret").private
    assert "alice/new" not in hub.server.state.repos


def test_raw_protocol_redirect_range_and_signatures(hub):
    """What the client relies on, byte for byte: LFS resolve = 302 + linked metadata; ranges; signed URLs."""
    import http.client
    import json
    from urllib.parse import urlsplit

    def request(url, method="GET", body=None, headers=None):
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request(
            method,
            parts.path + (f"?{parts.query}" if parts.query else ""),
            body=body,
            headers={"Authorization": f"Bearer {hub.write_token}", **(headers or {})},
        )
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, dict(resp.getheaders()), data

    payload = bytes(range(256)) * 40
    sha = hashlib.sha256(payload).hexdigest()
    assert request(f"{hub.url}/api/repos/create", "POST", json.dumps({"name": "raw"}))[0] == 200
    status, _, body = request(
        f"{hub.url}/alice/raw.git/info/lfs/objects/batch",
        "POST",
        json.dumps({"operation": "upload", "transfers": ["basic"], "objects": [{"oid": sha, "size": len(payload)}]}),
    )
    upload = json.loads(body)["objects"][0]["actions"]["upload"]["href"]
    assert request(upload.split("?")[0], "PUT", payload)[0] == 403  # unsigned
    assert request(upload, "PUT", payload[:-1])[0] == 400  # content does not match the oid
    assert request(upload, "PUT", payload)[0] == 200
    ndjson = "\n".join(
        json.dumps(line)
        for line in (
            {"key": "header", "value": {"summary": "raw commit"}},
            {"key": "lfsFile", "value": {"path": "w.safetensors", "algo": "sha256", "oid": sha, "size": len(payload)}},
        )
    )
    status, _, body = request(
        f"{hub.url}/api/models/alice/raw/commit/main", "POST", ndjson, {"Content-Type": "application/x-ndjson"}
    )
    commit = json.loads(body)["commitOid"]

    status, headers, _ = request(f"{hub.url}/alice/raw/resolve/main/w.safetensors", "HEAD")
    assert status == 302 and headers["X-Repo-Commit"] == commit
    assert headers["X-Linked-Etag"] == f'"{sha}"' and headers["X-Linked-Size"] == str(len(payload))
    location = headers["Location"]
    assert urlsplit(location).port != urlsplit(hub.url).port  # the store: another origin, no auth forwarded
    status, headers, data = request(location, headers={"Range": "bytes=1000-"})
    assert status == 206 and data == payload[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(payload) - 1}/{len(payload)}"
    assert request(location, headers={"Range": f"bytes={len(payload)}-"})[0] == 416
    assert request(location.split("?")[0])[0] == 403
    status, headers, _ = request(f"{hub.url}/alice/raw/resolve/main/missing.txt", "HEAD")
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound" and headers["X-Repo-Commit"] == commit

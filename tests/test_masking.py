"""Masking (SPEC §3 rule 8): every pattern, in every file a context writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contexts import CompressionPolicy, ContextStore, masking
from contexts.masking import mask, mask_value, register_secrets
from tests.helpers.context_support import (
    CONFIG,
    TASK_KEY,
    every_context_is_valid,  # noqa: F401 - autouse: checks what each test left
)
from tests.helpers.schemas import validate_context_dir

GITHUB = "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
PEM_BODY = "MIIEowIBAAKCAQEAwJ0Yl3pU9nI4a8F1p\nq7D3+/zZq2X0Yw=="
GITLAB_BODY = "Xy7_Q2-wR9tK4mN8pL3zV"
OPENAI_TAIL = "T3BlbkFJ" + "q8Wz2Lm4Xc6Vb9Nk1Rt5"
OPENAI = "sk-proj-" + OPENAI_TAIL
# (text, what it must become, the part that must never reach a file)
CASES = [
    *((f"token {p}{GITHUB} end", "token [GITHUB_TOKEN] end", GITHUB) for p in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (
        "GITHUB_TOKEN=github_pat_11ABCDEFG0123456789abc_" + "k" * 59,
        "GITHUB_TOKEN=[GITHUB_TOKEN]",
        "11ABCDEFG0123456789abc",
    ),
    ("OPENAI_API_KEY=sk-" + "a1B2" * 12, "OPENAI_API_KEY=[OPENAI_KEY]", "a1B2a1B2a1B2"),
    ("Authorization: Bearer sk-proj-" + "Zx_9-" * 8, "Authorization: Bearer [OPENAI_KEY]", "Zx_9-Zx_9-"),
    ("PRIVATE-TOKEN: glpat-" + "Ab3_-" * 4, "PRIVATE-TOKEN: [GITLAB_TOKEN]", "Ab3_-Ab3_-"),
    ("mail alice.smith+ci@mail.example.co.jp now", "mail [EMAIL] now", "alice.smith+ci"),
    (
        "git clone https://bob:hunter2@git.example.com/o/r.git",
        "git clone https://[CREDENTIALS]@git.example.com/o/r.git",
        "hunter2",
    ),
    (
        "remote: https://x-access-token:ghs_" + GITHUB + "@github.com/o/r.git",
        "remote: https://[CREDENTIALS]@github.com/o/r.git",
        GITHUB,
    ),
    (
        "key:\n-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY + "\n-----END RSA PRIVATE KEY-----\ndone",
        "key:\n[PRIVATE_KEY]\ndone",
        "MIIEowIBAAKCAQEA",
    ),
    (
        "-----BEGIN PRIVATE KEY-----\n" + PEM_BODY + "\n-----END PRIVATE KEY-----",
        "[PRIVATE_KEY]",
        "MIIEowIBAAKCAQEA",
    ),
    # -- shapes the first rules missed (issue 10 §3) --
    *(
        (f"GITLAB_TOKEN={p}{GITLAB_BODY} end", "GITLAB_TOKEN=[GITLAB_TOKEN] end", GITLAB_BODY)
        for p in ("gldt-", "glrt-", "glrtr-", "glptt-", "glcbt-64_", "glsoat-", "gloas-", "glimt-", "glagent-",
                  "glft-", "glffct-", "glwt-", "GR1348941")
    ),
    (  # routable: the CRC after the second dot is part of the token
        "PRIVATE-TOKEN: glpat-" + "eyJvIjoiMSIsInUiOiIyIn0Ab3_-Cd4eF5gH6iJ" + ".01.0s9ybcmxl",
        "PRIVATE-TOKEN: [GITLAB_TOKEN]",
        "0s9ybcmxl",
    ),
    ("export FOO_ghp_" + GITHUB, "export FOO_[GITHUB_TOKEN]", GITHUB),
    ("x_" + OPENAI, "x_[OPENAI_KEY]", OPENAI_TAIL),
    ("key=-" + OPENAI, "key=-[OPENAI_KEY]", OPENAI_TAIL),
    ("?token=ghp%5F" + GITHUB + "&x=1", "?token=[GITHUB_TOKEN]&x=1", GITHUB),
    ("?q=token%3Dghp_" + GITHUB, "?q=token%3D[GITHUB_TOKEN]", GITHUB),
    ("pat=github_pat%5F11ABCDEFG0123456789abc%5F" + "k9" * 29, "pat=[GITHUB_TOKEN]", "11ABCDEFG0123456789abc"),
    ("pat=github%5Fpat%5F11ABCDEFG0123456789abc%5F" + "k9" * 29, "pat=[GITHUB_TOKEN]", "11ABCDEFG0123456789abc"),
    ('{"log":"cloning\\nghp_' + GITHUB + '\\n"}', '{"log":"cloning\\n[GITHUB_TOKEN]\\n"}', GITHUB),
    ("トークンはghp_" + GITHUB, "トークンは[GITHUB_TOKEN]", GITHUB),
    (
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + PEM_BODY + "\n=Xb1q\n-----END PGP PRIVATE KEY BLOCK-----\nok",
        "[PRIVATE_KEY]\nok",
        "MIIEowIBAAKCAQEA",
    ),
    (
        "push to https://user:pa/ss@word@git.example.com/o/r.git",
        "push to https://[CREDENTIALS]@git.example.com/o/r.git",
        "pa/ss@word",
    ),
    (
        "REDIS_URL=redis://:p@ss/w0rd@cache.internal:6379/0",
        "REDIS_URL=redis://[CREDENTIALS]@cache.internal:6379/0",
        "w0rd",
    ),
    (
        "curl -H 'Authorization: Basic dXNlcjpodW50ZXIy' https://api.example.com",
        "curl -H 'Authorization: Basic [CREDENTIALS]' https://api.example.com",
        "dXNlcjpodW50ZXIy",
    ),
    (
        "authorization: bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
        "authorization: bearer [CREDENTIALS]",
        "c2lnbmF0dXJl",
    ),
    (
        "-H 'Authorization: token 0123456789abcdef0123456789abcdef01234567'",
        "-H 'Authorization: token [CREDENTIALS]'",
        "0123456789abcdef",
    ),
    ('{"AUTHORIZATION": "Bearer abc.def-ghi"}', '{"AUTHORIZATION": "Bearer [CREDENTIALS]"}', "abc.def-ghi"),
    # last: a block cut off masks everything after it
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n" + PEM_BODY + "\n(output cut off)",
        "[PRIVATE_KEY]",
        "MIIEowIBAAKCAQEA",
    ),
]
HARMLESS = [
    "plain text, nothing to hide",
    "task-list and risk-free and desk-top-0123456789abcdefgh",  # sk- inside a word
    "ghp_short",  # too short to be a token
    "https://example.com/path?q=1",
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----",
    "日本語のテキスト",
    "",
    # -- what the wider rules of issue 10 §3 must still leave alone --
    "git remote add origin git@github.com:org/r.git",  # an SSH remote: `git` is a user, not an address
    "git@gitlab.example.com:group/sub/project.git",
    "ssh://git@github.com/org/r.git",
    "rsync -a dist/ deploy@build.example.com:/srv/app",
    "task-1234567890abcdef1234 disk-usage risk-assessment ask-me mask-layer",
    "--sk-allow-fallback-to-the-default-region lang=sk-SK",  # glued `sk-` with a tail that is no key
    "http://localhost:5173/@vite/client https://example.com:8443/users/@alice",  # a port, then `@` in the path
    "https://www.npmjs.com/package/@types/node",
    "Authorization header is missing; see Authorization: docs",
    'headers = {"Authorization": f"Bearer {token}"}  # Authorization: Bearer $GITHUB_TOKEN',
    "0f8e3c2a-9b1d-4e5f-8a7b-6c5d4e3f2a1b b874ff3a0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f",
    "/home/user/.ssh/id_ed25519.pub src/tasks/disk-usage.py glob-pattern_globals",
]


@pytest.mark.parametrize(("text", "masked", "fragment"), CASES)
def test_every_pattern_is_replaced(text: str, masked: str, fragment: str) -> None:
    assert mask(text) == masked
    assert fragment not in mask(text)


@pytest.mark.parametrize("text", HARMLESS)
def test_text_without_secrets_is_left_alone(text: str) -> None:
    assert mask(text) == text


def test_mask_value_walks_dicts_lists_tuples_and_keys() -> None:
    value = {
        "nested": [{"url": "https://u:p4ss@h.example/x"}, ("ghp_" + GITHUB,)],
        "alice@example.com": 3,
        "n": 7,
        "none": None,
        "flag": True,
    }
    assert mask_value(value) == {
        "nested": [{"url": "https://[CREDENTIALS]@h.example/x"}, ["[GITHUB_TOKEN]"]],
        "[EMAIL]": 3,
        "n": 7,
        "none": None,
        "flag": True,
    }


def test_registered_literal_secrets_are_masked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masking, "_literal_secrets", set())
    register_secrets(["s3cr3t-webhook-value", None, "", "short"])
    assert mask("sig=s3cr3t-webhook-value;") == "sig=[SECRET];"
    assert mask("short stays") == "short stays"  # too short to mask safely


@settings(max_examples=200)
@given(st.lists(st.one_of(st.text(max_size=30), st.sampled_from([t for t, _, _ in CASES])), max_size=4).map("".join))
def test_masking_twice_changes_nothing_more(text: str) -> None:
    once = mask(text)
    assert mask(once) == once


def test_mask_value_masks_the_new_shapes_in_keys_and_values() -> None:
    value = {"FOO_ghp_" + GITHUB: ["Authorization: Basic dXNlcjpodW50ZXIy"], "k": ("x_" + OPENAI,)}
    assert mask_value(value) == {"FOO_[GITHUB_TOKEN]": ["Authorization: Basic [CREDENTIALS]"], "k": ["x_[OPENAI_KEY]"]}


@pytest.fixture
def every_secret_everywhere(tmp_path: Path) -> Path:
    """A completed context whose messages, tools, metadata and state were all given every secret."""
    secrets_text = "\n".join(text for text, _, _ in CASES)
    store = ContextStore(tmp_path, fsync="never")
    config = {**CONFIG, "base_url": "https://bob:hunter2@llm.example.com/v1", "note": secrets_text}
    ctx = store.create(
        {**TASK_KEY, "owner": "alice.smith+ci@mail.example.co.jp"}, config, user=secrets_text, heartbeat=False
    )
    ctx.append_message("system", secrets_text)
    ctx.append_message("user", secrets_text)
    ctx.append_message(
        "assistant",
        None,
        tool_calls=[
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": secrets_text})},
            }
        ],
    )
    ctx.append_message("tool", secrets_text, tool_call_id="c1", tool_name="bash")
    ctx.append_tool(
        "bash", {"command": secrets_text, secrets_text: 1}, "error", 5, result=secrets_text, error=secrets_text
    )
    ctx.update_state(last_activity=secrets_text)
    ctx.compress(lambda _previous, _span: "summary: " + CASES[0][0], CompressionPolicy(keep_recent=0))
    return ctx.finish("failed", error=secrets_text)


def test_no_secret_reaches_any_file_of_the_context(every_secret_everywhere: Path) -> None:
    path = every_secret_everywhere
    everything = "".join(p.read_text(encoding="utf-8") for p in path.iterdir() if p.is_file())
    for text, _, fragment in CASES:
        assert fragment not in everything, text
    assert "hunter2" not in everything
    assert "alice.smith" not in everything
    validate_context_dir(path)


@pytest.mark.parametrize("file_name", ["messages.jsonl", "tools.jsonl", "metadata.json", "state.json"])
def test_each_file_carries_the_replacement_markers(every_secret_everywhere: Path, file_name: str) -> None:
    text = (every_secret_everywhere / file_name).read_text(encoding="utf-8")
    for marker in ("[GITHUB_TOKEN]", "[OPENAI_KEY]", "[GITLAB_TOKEN]", "[EMAIL]", "[CREDENTIALS]", "[PRIVATE_KEY]"):
        assert marker in text, (file_name, marker)


def test_the_state_error_field_is_masked(every_secret_everywhere: Path) -> None:
    state = json.loads((every_secret_everywhere / "state.json").read_text())
    assert state["status"] == "failed"
    assert state["error"] == "\n".join(masked for _, masked, _ in CASES)
    summary = json.loads((every_secret_everywhere / "summaries.jsonl").read_text())
    assert summary["summary"] == "summary: token [GITHUB_TOKEN] end"

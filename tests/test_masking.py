"""Masking (SPEC §3 rule 8): every pattern, in every file a context writes."""

from __future__ import annotations

import base64
import json
import operator
import re
import string
from pathlib import Path
from urllib.parse import urlencode

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from contexts import CompressionPolicy, ContextStore, masking
from contexts.masking import mask, mask_reasoning, mask_value, register_secrets
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


# -- properties over generated shapes ---------------------------------------------------------------------------
#
# Each strategy builds one family with random alphabets and lengths; each embedding puts the result in text the
# way logs, shells, JSON and URLs do.  The assertion is exact: the token, and nothing else, becomes the label.

ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "-_"
BASE36 = string.ascii_lowercase + string.digits
BASE64 = ALNUM + "+/"


def chars(alphabet: str, min_size: int, max_size: int) -> st.SearchStrategy[str]:
    return st.text(st.sampled_from(alphabet), min_size=min_size, max_size=max_size)


def generated_key(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    """A generated key's tail: URL-safe characters that include lower case, upper case and a digit somewhere."""
    forced = st.tuples(*(st.sampled_from(a) for a in (string.ascii_lowercase, string.ascii_uppercase, string.digits)))
    pool = st.tuples(chars(URLSAFE, min_size - 3, max_size - 3), forced).map(lambda t: [*t[0], *t[1]])
    return pool.flatmap(st.permutations).map("".join)


GITHUB_TOKENS = st.one_of(
    st.builds(operator.add, st.sampled_from(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]), chars(ALNUM, 16, 80)),
    st.builds("github_pat_{}_{}".format, chars(ALNUM, 22, 22), chars(ALNUM, 16, 59)),
).map(lambda token: (token, "[GITHUB_TOKEN]"))
GITLAB_PREFIXES = ["glpat-", "gldt-", "glrt-", "glrtr-", "glptt-", "glcbt-", "glsoat-", "gloas-", "glimt-",
                   "glagent-", "glft-", "glffct-", "glwt-", "GR1348941"]
GITLAB_TOKENS = st.one_of(
    st.builds(operator.add, st.sampled_from(GITLAB_PREFIXES), chars(URLSAFE, 20, 64)),
    st.builds("glpat-{}.01.{}".format, chars(URLSAFE, 27, 310), chars(BASE36, 7, 9)),  # routable
).map(lambda token: (token, "[GITLAB_TOKEN]"))
OPENAI_PREFIXES = ["sk-", "sk-proj-", "sk-svcacct-", "sk-admin-", "sk-None-", "sk-ant-api03-", "sk-ant-admin01-"]
OPENAI_KEYS = st.builds(operator.add, st.sampled_from(OPENAI_PREFIXES), generated_key(20, 160)).map(
    lambda token: (token, "[OPENAI_KEY]")
)
TOKENS = st.one_of(GITHUB_TOKENS, GITLAB_TOKENS, OPENAI_KEYS)
# An `_` inside a token may arrive URL-encoded (`ghp%5F...`); `-` and `.` are never encoded.
ENCODED_TOKENS = st.tuples(TOKENS, st.sampled_from(["_", "%5F", "%5f"])).map(
    lambda t: (t[0][0].replace("_", t[1]), t[0][1])
)
BEFORE = ["", " ", "token ", "TOKEN=", "key: ", '"', "'", "`", "FOO_", "x_", "x-", "key=-", "--api-key=", "(", "[",
          "\t", "\n", "%3D", "%20", "\\n", '\\"', "\\u003d", "Authorization: Bearer ", "トークンは", "password "]
AFTER = ["", " ", "\n", '"', "'", "`", ",", ";", ")", "]", "&x=1", "%22", "%26", "\\n", '\\"', " end"]


def embeddings(token: str) -> st.SearchStrategy[str]:
    """``token`` inside text: after a separator, in a JSON string, in a query string, as a URL's user name."""
    return st.one_of(
        st.builds("{}{}{}".format, st.sampled_from(BEFORE), st.just(token), st.sampled_from(AFTER)),
        st.builds(
            lambda ascii_only, words: json.dumps({"output": f"{words}\n{token}\n{words}"}, ensure_ascii=ascii_only),
            st.booleans(),
            st.sampled_from(["cloning into r", "トークン", "ok"]),
        ),
        st.just(f"https://api.example.com/v1?{urlencode({'q': 'a b/c'})}&access_token={token}&n=1"),
        st.just(f"git clone https://{token}@github.com/o/r.git"),
    )


@settings(max_examples=500)
@given(st.one_of(TOKENS, ENCODED_TOKENS).flatmap(lambda t: st.tuples(st.just(t), embeddings(t[0]))))
def test_no_generated_token_survives_in_any_surrounding(case: tuple[tuple[str, str], str]) -> None:
    (token, label), text = case
    assert mask(text) == text.replace(token, label)


PRIVATE_KEY_KINDS = ["", "RSA ", "EC ", "DSA ", "OPENSSH ", "ENCRYPTED ", "PGP "]


@settings(max_examples=200)
@given(
    st.sampled_from(PRIVATE_KEY_KINDS),
    st.lists(chars(BASE64, 1, 64), min_size=1, max_size=8).map("\n".join),
    st.sampled_from(["ok", "$ ls", "Version: 1"]),
    st.sampled_from(["whole", "json", "cut off"]),
)
def test_no_generated_private_key_block_survives(kind: str, body: str, after: str, form: str) -> None:
    armor = " BLOCK" if kind == "PGP " else ""
    block = f"-----BEGIN {kind}PRIVATE KEY{armor}-----\n{body}\n-----END {kind}PRIVATE KEY{armor}-----"
    if form == "cut off":
        assert mask(f"{after}\n{block[: len(block) // 2]}") == f"{after}\n[PRIVATE_KEY]"
    elif form == "json":
        assert mask(json.dumps({"key": block, "after": after})) == json.dumps({"key": "[PRIVATE_KEY]", "after": after})
    else:
        assert mask(f"key:\n{block}\n{after}") == f"key:\n[PRIVATE_KEY]\n{after}"


HOSTS = st.builds(
    "{}{}".format,
    st.sampled_from(["git.example.com", "db", "cache.internal", "10.0.0.7", "xn--bcher-kva.example"]),
    st.sampled_from(["", ":5432", ":6379"]),
)
PATHS = st.sampled_from(["", "/", "/o/r.git", "/0", "/app?sslmode=require", "/x#frag", "?q=1"])
PASSWORD_CHARS = ALNUM + "!$&()*+,;=:%~-._@"


@settings(max_examples=300)
@given(
    st.sampled_from(["https", "http", "redis", "rediss", "postgres", "mongodb+srv", "amqp", "ftp"]),
    chars(ALNUM + "._-", 0, 12),
    # `/` and then `?` or `#` would start a path and a query: a password holds one kind or the other
    st.one_of(chars(PASSWORD_CHARS + "/", 1, 24), chars(PASSWORD_CHARS + "?#", 1, 24)),
    HOSTS,
    PATHS,
)
def test_no_generated_url_password_survives(scheme: str, user: str, password: str, host: str, path: str) -> None:
    """The password may hold `@`, `:` and `/` (or `?#`): everything up to the last `@` before the host goes."""
    # The one shape read the other way: `host:port/...@host`, as in `http://localhost:5173/@vite/client`.
    assume(not (("." in user or user == "localhost") and re.match(r"\d{1,5}(?:[/?#]|$)", password)))
    text = f"remote {scheme}://{user}:{password}@{host}{path} done"
    assert mask(text) == f"remote {scheme}://[CREDENTIALS]@{host}{path} done"


@settings(max_examples=300)
@given(
    st.sampled_from(["Authorization", "authorization", "AUTHORIZATION", "Proxy-Authorization"]),
    st.sampled_from(["Basic", "Bearer", "bearer", "token", "Token", "BEARER"]),
    st.one_of(
        chars(BASE64, 4, 80).map(lambda c: c + "=="),  # Basic
        chars(URLSAFE + ".~", 1, 200),  # Bearer: opaque, or a JWT
        chars("0123456789abcdef", 40, 40),  # token
    ),
    st.sampled_from(["{n}: {s} {c}", "-H '{n}: {s} {c}'", '-H "{n}:{s} {c}"', '{{"{n}": "{s} {c}"}}',
                     "{{'{n}': '{s} {c}'}}", '{{\\"{n}\\": \\"{s} {c}\\"}}', "?{n}={s}%20{c}&next=1",
                     "?{n}={s}+{c}&next=1"]),
)
def test_no_generated_authorization_credential_survives(name: str, scheme: str, credential: str, form: str) -> None:
    assume(credential[0] not in "$<{%[")  # placeholders and templates are no credentials
    text = form.format(n=name, s=scheme, c=credential)
    assert mask(text) == form.format(n=name, s=scheme, c="[CREDENTIALS]")


WORDS = ["task", "disk", "risk", "ask", "mask", "desk", "usage", "assessment", "list", "glob", "globals", "high",
         "right", "sk", "gh", "gl", "pat", "token", "api", "key", "proj", "ant", "the", "default", "region"]
BENIGN = st.one_of(
    st.sampled_from([h for h in HARMLESS if h]),
    st.uuids().map(str),
    chars("0123456789abcdef", 40, 40),  # a commit SHA
    chars("0123456789abcdef", 64, 64),
    # kebab and snake identifiers, glued `sk-` and all: no key has a one-case tail of words
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map("-".join).map(lambda w: f"--{w}"),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map("_".join),
    st.builds("{}-{}".format, st.sampled_from(["task", "disk", "risk", "ask"]), chars("0123456789abcdef", 20, 40)),
    st.builds(  # scp-like remotes and ssh URLs: a user and a host, never an address
        "{}{}/{}.git".format,
        st.sampled_from(["git@github.com:", "git@gitlab.example.com:", "ssh://git@github.com/", "u@ci.example.org:~/"]),
        chars(ALNUM + "-_", 1, 20),
        chars(ALNUM + "-_.", 1, 20),
    ),
    st.builds("/home/{}/src/{}.py".format, chars(string.ascii_lowercase, 1, 8), st.sampled_from(WORDS)),
    st.binary(min_size=1, max_size=48).map(lambda b: f"the value {base64.b64encode(b).decode()} is not a key"),
)


@settings(max_examples=500)
@given(st.lists(BENIGN, min_size=1, max_size=5).map(" ".join))
def test_benign_text_is_left_alone(text: str) -> None:
    assert mask(text) == text


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


def test_reasoning_keeps_its_opaque_fields_byte_for_byte_and_drops_an_item_it_would_have_to_mask() -> None:
    # URL-safe base64 ciphertext may hold what looks like a key: masking it would make the API refuse the item.
    looks_like_a_key = "gAAAAB-" + "glpat-" + "A" * 20 + "_x-y"
    clean = {"type": "thinking", "thinking": "the test fails on add", "signature": looks_like_a_key}
    leaky = {"type": "thinking", "thinking": "the token is ghp_" + "a" * 36, "signature": "c2ln"}
    encrypted = {"type": "reasoning", "id": "rs_1", "encrypted_content": looks_like_a_key, "summary": []}
    kept = mask_reasoning({"provider": "anthropic", "items": [clean, leaky, encrypted]})
    assert kept == {"provider": "anthropic", "items": [clean, encrypted]}
    assert mask_value(clean) != clean  # the plain rule would have changed the signature

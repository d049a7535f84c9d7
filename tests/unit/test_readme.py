"""The documentation's examples are valid on the demo server (the CPU profile's settings): every
JSON body of a curl and every hymt command in README.md, docs/*.md and loadtest/README.md; and
every link among them reaches a file and a heading."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import yaml

from hymt_serve.cli.main import build_parser
from hymt_serve.core.settings import Settings
from hymt_serve.request import oip, openai_api
from hymt_serve.request.chat import parse_body
from hymt_serve.request.families import detect_profile
from hymt_serve.request.protocol import parse_request

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "loadtest/README.md"]
# A curl to a model's predictions endpoint, then its -d '<json>' (the shell examples).
CURL_BODY = re.compile(r"curl [^\n]*?/predictions/([\w-]+)[^']*?-d '(\{[^']*\})'", re.DOTALL)
# A curl to the web front end's request API, which forwards the body to the translation model.
WEB_CURL_BODY = re.compile(r"curl [^\n]*?:8000/api/(?:translate|refine)[^']*?-d '(\{[^']*\})'")
# The demo's models: the translation model (its configured family) and the Chimera model.
DEMO_MODELS = {"hunyuan-mt": None, "hunyuan-mt-chimera": "hunyuan-mt-chimera"}


def demo_settings() -> Settings:
    config = yaml.safe_load((REPO / "configs/model-config-cpu.yaml").read_text())
    return Settings.from_mapping({**config["handler"], "model_path": "/unused"}, environ={})


def doc_bodies(pattern: re.Pattern[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(file name, the pattern's groups) for each match in README.md and docs/*.md."""
    found = []
    for path in DOCS:
        for match in pattern.finditer(path.read_text()):
            found.append((path.name, match.groups()))
    return found


def test_the_docs_are_read() -> None:
    assert (REPO / "docs/api.md") in DOCS and (REPO / "README.md") in DOCS


def test_every_request_example_is_accepted_by_the_demo_server() -> None:
    bodies = doc_bodies(CURL_BODY)
    files = {name for name, _ in bodies}
    assert {"README.md", "api.md", "families.md", "documents.md"} <= files
    # the single, multi-text, sampling, streaming, glossary, context, formatted, Chimera and
    # document examples
    assert len(bodies) >= 9
    settings = demo_settings()
    for _, (model, body) in bodies:
        family = DEMO_MODELS[model] or settings.loading.prompt_family
        profile = detect_profile(settings.model_path, family)
        parse_body(json.loads(body), settings, profile)  # raises InvalidRequest, PayloadTooLarge
    assert any('"messages"' in body for _, (_, body) in bodies)  # the chat form's example


def test_every_web_request_example_is_accepted_by_the_demo_server() -> None:
    bodies = doc_bodies(WEB_CURL_BODY)
    assert bodies  # /api/refine in families.md
    settings = demo_settings()
    profile = detect_profile(settings.model_path, settings.loading.prompt_family)
    for _, (body,) in bodies:
        parse_request(json.loads(body), settings, profile)


# A curl to a model's v2 inference endpoint (KServe's Open Inference Protocol), then its body.
V2_CURL_BODY = re.compile(r"curl [^\n]*?/v2/models/([\w-]+)/infer[^']*?-d '(\{[^']*\})'", re.DOTALL)


def test_every_v2_example_is_accepted_by_the_demo_server() -> None:
    found = doc_bodies(V2_CURL_BODY)
    assert found
    settings = demo_settings()
    profile = detect_profile(settings.model_path, settings.loading.prompt_family)
    for _, (_, body) in found:
        fields, call = oip.unwrap(json.loads(body), {"Content-Type": "application/json"})
        assert call is not None
        parse_request(fields, settings, profile)


# A curl to the web front end's OpenAI-compatible API, then its body.
OPENAI_CURL_BODY = re.compile(
    r"curl [^\n]*?:8000/v1/(chat/completions|completions)[^']*?-d '(\{[^']*\})'", re.DOTALL
)


def test_every_openai_example_is_accepted_by_the_demo_server() -> None:
    """Each body as the front end reads it (openai_api), then what it sends TorchServe as the
    handler reads it."""
    found = doc_bodies(OPENAI_CURL_BODY)
    assert {route for _, (route, _) in found} == {"chat/completions", "completions"}
    settings = demo_settings()
    profile = detect_profile(settings.model_path, settings.loading.prompt_family)
    for _, (route, body) in found:
        parse = (
            openai_api.parse_chat if route == "chat/completions" else openai_api.parse_completion
        )
        call = parse(json.loads(body), ("hunyuan-mt",))  # the front end serves one model
        parse_body(call.forward, settings, profile)


# A Markdown link or image whose target is a path in this repository (optionally #anchor).
LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s#]*)(?:#([^)\s]*))?\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")  # inline code: `[label](url)` is an example, not a link


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, spaces as '-', punctuation
    other than '-' and '_' dropped."""
    text = FENCE.sub("", path.read_text())
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in HEADING.findall(text)
    }


def test_every_link_in_the_docs_reaches_a_file_and_heading() -> None:
    broken = []
    for path in DOCS:
        text = CODE.sub("", FENCE.sub("", path.read_text()))
        for target, anchor in LINK.findall(text):
            linked = (path.parent / target).resolve() if target else path
            if not linked.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{path.name}: {target}#{anchor}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


# A shell block of the docs, and a hymt command in it: at a line's start, in $(...) or after --.
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
HYMT_COMMAND = re.compile(r"(?:^|\$\(|-- )hymt ([^)\n#]*)", re.MULTILINE)


def test_every_hymt_command_in_the_docs_parses() -> None:
    commands = [
        (path.name, command.strip())
        for path in DOCS
        for block in BASH_BLOCK.findall(path.read_text())
        for command in HYMT_COMMAND.findall(block)
    ]
    assert len(commands) >= 5  # archive, start, translate, token, stop
    parser = build_parser()
    for name, command in commands:
        try:
            parser.parse_args(shlex.split(command))
        except SystemExit as error:
            raise AssertionError(f"{name}: hymt {command}") from error

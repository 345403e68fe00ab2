"""Send one recorded curator request three times to the model server: as recorded (the lesson schema without a
pattern, since c1b5d0b: minLength 1, maxLength 600), with LESSON_PATTERN added to that, and with the lesson
schema as it was before c1b5d0b (maxLength 600 and LESSON_PATTERN, no minLength). Prints one JSON line per
variant: HTTP status, whether the answer came back in a Markdown fence, and the start of the answer
or error. With --ask-fence the system message also asks for a fenced answer, which only a server that enforces
the schema can stop. Usage: python pattern_probe.py REQUEST.json [--ask-fence] [BASE]
(BASE default http://127.0.0.1:8090). A fourth variant sends no response_format at all: what the model writes
when nothing is enforced. --only=PREFIX sends only the variants whose name starts with PREFIX."""

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from combee.prompts.schemas import LESSON_PATTERN, LESSON_SCHEMA


def lesson_as(node, lesson):
    if isinstance(node, dict):
        if node == LESSON_SCHEMA:
            return dict(lesson)
        return {k: lesson_as(v, lesson) for k, v in node.items()}
    if isinstance(node, list):
        return [lesson_as(v, lesson) for v in node]
    return node


def send(base, body):
    started = time.monotonic()
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=1800) as response:
            text = json.loads(response.read())["choices"][0]["message"]["content"]
            status = response.status
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")
    return status, text, time.monotonic() - started


args = sys.argv[1:]
ask_fence = "--ask-fence" in args
args = [a for a in args if a != "--ask-fence" and not a.startswith("--only=")]
body = json.loads(Path(args[0]).read_text())
base = args[1] if len(args) > 1 else "http://127.0.0.1:8090"
if ask_fence:
    body["messages"][0]["content"] += " Always write your answer inside a ```json Markdown code fence."
variants = {"as recorded, no pattern": body}
for name, lesson in (
    ("LESSON_PATTERN added", {**LESSON_SCHEMA, "pattern": LESSON_PATTERN}),
    (
        "lesson schema before c1b5d0b",
        {"type": "string", "maxLength": LESSON_SCHEMA["maxLength"], "pattern": LESSON_PATTERN},
    ),
):
    variant = json.loads(json.dumps(body))
    variant["response_format"] = lesson_as(variant["response_format"], lesson)
    assert variant != body, "the request has no lesson schema to change"
    variants[name] = variant
unconstrained = json.loads(json.dumps(body))
del unconstrained["response_format"]
variants["no response_format (nothing enforced)"] = unconstrained
only = [a.removeprefix("--only=") for a in sys.argv[1:] if a.startswith("--only=")]
for name, variant in variants.items():
    if only and not any(name.startswith(o) for o in only):
        continue
    status, text, seconds = send(base, variant)
    fenced = text.lstrip().startswith("```")
    print(
        json.dumps(
            {
                "variant": name,
                "ask_fence": ask_fence,
                "status": status,
                "fenced": fenced,
                "seconds": round(seconds, 1),
                "begins": text[:160],
            }
        ),
        flush=True,
    )

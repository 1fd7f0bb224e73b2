"""A local stand-in for the model APIs real agent harnesses call, scripted: the model's turns
are shell commands for the harness's own shell tool to run, one per turn, then a last word.

It serves, on 127.0.0.1, Anthropic's Messages API (Claude Code: `ANTHROPIC_BASE_URL`) and
OpenAI's Responses API (Codex: a model provider with `base_url`), streamed as server-sent events
(or plain JSON when the request does not stream), and records what each command gave back, as
the harness reported it to the model. Nothing of it is a real model: the tests judge the
sandbox by what the harness's own tool could do.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

FINAL_WORD = "All steps are done."


class AgentAPI:
    """A scripted model on 127.0.0.1:port; `results[i]` is what the harness reported for
    script[i] (filled in as the harness sends it back)."""

    def __init__(self, script: Sequence[str]) -> None:
        self.script = list(script)
        self.results: dict[int, str] = {}
        self.requests: list[str] = []  # each request's path, for diagnosis
        self.keys: set[str] = set()  # every x-api-key and Authorization the API was sent
        self.done = threading.Event()  # the last word was sent
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                api.requests.append(self.path)
                for header in ("x-api-key", "authorization"):
                    if self.headers.get(header):
                        api.keys.add(self.headers[header])
                if self.path.startswith("/v1/messages/count_tokens"):
                    self._json({"input_tokens": 100})
                elif self.path.startswith("/v1/messages"):
                    self._answer(body, api.anthropic_events(body))
                elif self.path.startswith("/v1/responses"):
                    self._answer(body, api.openai_events(body))
                else:
                    self._json({"error": {"message": f"no {self.path} here"}}, 404)

            def do_GET(self) -> None:
                self._json({"error": {"message": f"no {self.path} here"}}, 404)

            def _answer(
                self, body: dict[str, Any], events: list[tuple[str, dict[str, Any]]]
            ) -> None:
                if not body.get("stream"):
                    self._json(api.whole(events))
                    return
                payload = b"".join(
                    f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
                )
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _json(self, data: dict[str, Any], status: int = 200) -> None:
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AgentAPI:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -------------------------------------------------------------- Anthropic Messages

    def anthropic_events(self, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The streamed events of the next turn: a Bash tool call, or the last word."""
        tools = {tool.get("name") for tool in body.get("tools", [])}
        results = list(_anthropic_results(body.get("messages", [])))
        for tool_id, text in results:
            if tool_id.startswith("toolu_nsc_"):
                self.results[int(tool_id.removeprefix("toolu_nsc_"))] = text
        step = len([r for r in results if r[0].startswith("toolu_nsc_")])
        message = {"id": f"msg_nsc_{step}", "type": "message", "role": "assistant",
                   "model": body.get("model", "mock"), "content": [], "stop_reason": None,
                   "stop_sequence": None,
                   "usage": {"input_tokens": 10, "output_tokens": 1}}  # fmt: skip
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": message})
        ]
        if "Bash" in tools and step < len(self.script):
            block = {"type": "tool_use", "id": f"toolu_nsc_{step}", "name": "Bash", "input": {}}
            arguments = json.dumps({"command": self.script[step], "description": f"step {step}"})
            delta = {"type": "input_json_delta", "partial_json": arguments}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": FINAL_WORD if "Bash" in tools else "ok"}
            stop = "end_turn"
            if "Bash" in tools:
                self.done.set()
        events += [
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 10}}),
            ("message_stop", {"type": "message_stop"}),
        ]  # fmt: skip
        return events

    # -------------------------------------------------------------- OpenAI Responses

    def openai_events(self, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The streamed events of the next turn: a shell command through Codex's tools, or the
        last word."""
        outputs = list(_openai_results(body.get("input", [])))
        for call_id, text in outputs:
            if call_id.startswith("call_nsc_"):
                self.results[int(call_id.removeprefix("call_nsc_"))] = text
        step = len([o for o in outputs if o[0].startswith("call_nsc_")])
        if step < len(self.script):
            item = _openai_shell_call(body, step, self.script[step])
        else:
            word = {"type": "output_text", "text": FINAL_WORD, "annotations": []}
            item = {"type": "message", "role": "assistant", "id": f"msg_nsc_{step}",
                    "status": "completed", "content": [word]}  # fmt: skip
            self.done.set()
        response = {"id": f"resp_nsc_{step}", "object": "response", "status": "completed",
                    "model": body.get("model", "mock"), "output": [item],
                    "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": 10,
                              "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": 20}}  # fmt: skip
        created = {**response, "status": "in_progress", "output": []}
        return [
            ("response.created", {"type": "response.created", "response": created}),
            ("response.output_item.added", {"type": "response.output_item.added",
                                            "output_index": 0, "item": item}),
            ("response.output_item.done", {"type": "response.output_item.done",
                                           "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": response}),
        ]  # fmt: skip

    @staticmethod
    def whole(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """The non-streamed answer the events add up to."""
        for name, data in events:
            if name == "response.completed":
                return dict(data["response"])
        message: dict[str, Any] = dict(events[0][1]["message"])
        block = dict(events[1][1]["content_block"])
        delta = events[2][1]["delta"]
        if block["type"] == "tool_use":
            block["input"] = json.loads(delta["partial_json"])
        else:
            block["text"] = delta["text"]
        message["content"] = [block]
        message["stop_reason"] = events[4][1]["delta"]["stop_reason"]
        return message


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_of(part.get("text", part.get("content", ""))) for part in content
                         if isinstance(part, dict))  # fmt: skip
    return json.dumps(content)


def _anthropic_results(messages: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for message in messages:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                yield str(block.get("tool_use_id", "")), _text_of(block.get("content", ""))


def _openai_results(items: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for item in items:
        if item.get("type") in ("custom_tool_call_output", "function_call_output"):
            yield str(item.get("call_id", "")), _text_of(item.get("output", ""))


def _openai_tool_names(body: dict[str, Any]) -> set[str]:
    names = {str(tool.get("name")) for tool in body.get("tools", [])}
    for item in body.get("input", []):
        if item.get("type") == "additional_tools":
            for group in item.get("tools", []):
                names |= {str(tool.get("name")) for tool in group.get("tools", [])}
                names.add(str(group.get("name")))
    return names


def _openai_shell_call(body: dict[str, Any], step: int, command: str) -> dict[str, Any]:
    """Codex's way of running command, whichever its version offers: the code-mode `exec`
    tool (JavaScript calling the nested exec_command), or a plain shell function."""
    names = _openai_tool_names(body)
    call_id = f"call_nsc_{step}"
    if "exec" in names:
        source = (
            f"const r = await tools.exec_command({{cmd: {json.dumps(command)}, "
            "yield_time_ms: 10000});\ntext(r.output);\n"
        )
        return {"type": "custom_tool_call", "id": f"ctc_nsc_{step}", "call_id": call_id,
                "name": "exec", "input": source, "status": "completed"}  # fmt: skip
    name = "exec_command" if "exec_command" in names else "shell"
    arguments = (
        {"cmd": command} if name == "exec_command" else {"command": ["bash", "-lc", command]}
    )
    return {"type": "function_call", "id": f"fc_nsc_{step}", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}  # fmt: skip

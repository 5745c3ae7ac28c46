"""`pygpukit chat` driven in a pseudo-terminal (pexpect): a multi-turn exchange whose second
reply is the model's answer to the whole conversation, /reset, Ctrl-C stopping a reply
without ending the chat, and Ctrl-D quitting."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from pygpukit import llm

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("jinja2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sigint_default() -> None:
    # The child takes Ctrl-C as a terminal's program does even where the test runner
    # ignores SIGINT (a background job of a non-interactive shell): an ignored SIGINT is
    # inherited, and Python then installs no KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(*flags: str):
    env = {**os.environ, "PYTHONPATH": ROOT, "PYGPUKIT_BACKEND": "cpu", "TERM": "dumb"}
    return pexpect.spawn(sys.executable, ["-m", "pygpukit", "chat", "tiny", *flags], env=env,
                         encoding="utf-8", timeout=180, cwd=ROOT,
                         preexec_fn=_sigint_default)  # fmt: skip


def _reply(child) -> str:
    child.expect("\r\n> ")
    return child.before.replace("\r\n", "\n")


def test_multi_turn_reset_and_quit():
    from pygpukit.llm.tiny import write_tiny_model

    model = llm.load(write_tiny_model())
    child = _spawn("--max-tokens", "5", "--ignore-eos")
    child.expect("> ")
    child.sendline("hello")
    first = _reply(child).split("\n", 1)[1]  # after the echoed input line
    child.sendline("Alice was")
    second = _reply(child).split("\n", 1)[1]
    convo = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": first},
             {"role": "user", "content": "Alice was"}]  # fmt: skip
    ids = model.chat_ids(convo)
    want = model.generate_ids([ids], 5, stop_at_eos=False).tokens[0]
    assert second == model.tokenizer.decode(want)
    child.sendline("/reset")
    child.expect(r"\[conversation reset\]")
    child.expect("> ")
    child.sendline("hello")
    assert _reply(child).split("\n", 1)[1] == first  # a fresh conversation again
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_stops_a_reply_not_the_chat():
    child = _spawn("--max-tokens", "400", "--ignore-eos", "--max-model-len", "512")
    child.expect("> ")
    child.sendline("Alice was")
    child.expect("Alice was\r\n")  # the echoed input
    child.expect(r"\S")  # the reply has started
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.expect("> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

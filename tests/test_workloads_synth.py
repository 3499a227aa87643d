"""Prompt synthesis: exact lengths in a real tokenizer, completions and chat templates, unique
openings, shared prefix blocks, and the /tokenize client against a real HTTP server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workloads.build import BuildConfig, build_workload
from workloads.errors import SynthesisError
from workloads.synth import LocalTokenizer, PromptSynthesizer, RemoteTokenizer

TINY_MODEL = Path(__file__).resolve().parents[1] / ".cache" / "tiny-model"
TARGETS = (1, 2, 3, 5, 9, 17, 40, 63, 64, 200, 511, 513, 1000, 2500)


@pytest.fixture(scope="module")
def trained_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE trained here, whose post-processor adds BOS (unlike the tiny model's),
    with a chat template inside tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    words = ("the of and to in is was that for on as with by he at from his an were are this be "
             "or has had not but one their they new all been its also more first two time who "
             "water light house story river music game team road day year way man life").split()
    corpus = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) + "."
              for i in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    folder = tmp_path_factory.mktemp("tok")
    tok.save(str(folder / "tokenizer.json"))
    template = ("{% for m in messages %}{{ bos_token }}[{{ m['role'] }}] {{ m['content'] }}"
                "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": template}))
    return folder


def tokenizer_folders(trained: Path) -> list[Path]:
    return [trained] + ([TINY_MODEL] if (TINY_MODEL / "tokenizer.json").exists() else [])


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_exact_lengths(trained_tokenizer: Path, endpoint: str) -> None:
    for folder in tokenizer_folders(trained_tokenizer):
        tok = LocalTokenizer(folder)
        synth = PromptSynthesizer(tok, endpoint, seed=3)
        overhead = synth.measure("")
        for i, target in enumerate(TARGETS):
            built = synth.build(f"r{i:06d}", target)
            if target <= overhead:     # the template alone is longer: reported, not faked
                assert not built.exact
                continue
            assert built.exact, (folder, endpoint, target, built)
            if endpoint == "chat":
                assert built.prompt is None and len(built.messages) == 1
                assert tok.count_chat(built.messages) == target
            else:
                assert tok.count_prompt(built.prompt) == target
            if target >= 40:
                assert built.has_nonce


def test_special_tokens_are_counted(trained_tokenizer: Path) -> None:
    tok = LocalTokenizer(trained_tokenizer)
    assert tok.count_prompt("the river") == tok.count_text("the river") + 1   # <s>
    rendered = tok.render_chat([{"role": "user", "content": "hi"}])
    assert rendered == "<s>[user] hi</s>\n[assistant]"


def test_unique_openings_and_shared_blocks(trained_tokenizer: Path) -> None:
    tok = LocalTokenizer(trained_tokenizer)
    synth = PromptSynthesizer(tok, "completions", seed=0)
    a, b = synth.build("r000001", 300), synth.build("r000002", 300)
    assert a.prompt.split()[:3] != b.prompt.split()[:3]
    assert a.prompt != b.prompt
    # prefix sharing: same leading block ids -> same 512-token text; the nonce follows them
    x = synth.build("r000010", 1100, prefix_block_ids=[7, 8, 9])
    y = synth.build("r000011", 1300, prefix_block_ids=[7, 8, 5])
    z = synth.build("r000012", 700, prefix_block_ids=[4, 6])
    assert x.exact and y.exact and z.exact
    shared = synth.block_text(7) + synth.block_text(8)
    assert x.prompt.startswith(shared) and y.prompt.startswith(shared)
    assert not z.prompt.startswith(synth.block_text(7))
    ids_x, ids_y = tok.encode_prompt(x.prompt), tok.encode_prompt(y.prompt)
    assert ids_x[:1025] == ids_y[:1025]           # BOS + two 512-token blocks, token for token
    assert ids_x[1025:1045] != ids_y[1025:1045]   # then each request's own nonce


def test_build_synthesizes_mooncake_exactly(trained_tokenizer: Path, tmp_path: Path) -> None:
    rows = [{"timestamp": i * 100, "input_length": n, "output_length": 3 + i,
             "hash_ids": list(range(i, i + -(-n // 512)))}
            for i, n in enumerate((20, 70, 600, 1030, 300, 45))]
    src = tmp_path / "m.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    built = build_workload(BuildConfig("mooncake", str(src), n=60, seed=0,
                                       shares={"short": .3, "medium": .4, "long": .3}),
                           LocalTokenizer(trained_tokenizer))
    frame = built.frame
    logged = {r["input_length"] for r in rows}
    assert set(frame.prompt_tokens) <= logged and (frame.prompt_source == "synthesized").all()
    assert built.report["synthesis"]["exact"] == 60
    tok = LocalTokenizer(trained_tokenizer)
    assert all(tok.count_prompt(p) == n for p, n in zip(frame.prompt, frame.prompt_tokens,
                                                         strict=True))
    assert frame.prompt.nunique() == 60           # unique content per request
    assert frame.output_tokens.isin([r["output_length"] for r in rows]).all()


class _TokenizeHandler(BaseHTTPRequestHandler):
    """A stand-in target speaking vLLM's /tokenize protocol, counting with a real tokenizer."""

    tok: LocalTokenizer

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self._send(200, {"data": [{"id": "tiny"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/tokenize" or body.get("model") != "tiny":
            self._send(404, {"error": "no"})
            return
        if "messages" in body:
            ids = self.tok._tok.encode(self.tok.render_chat(body["messages"]),
                                       add_special_tokens=False).ids
        else:
            ids = self.tok._tok.encode(body["prompt"],
                                       add_special_tokens=body.get("add_special_tokens", True)).ids
        self._send(200, {"count": len(ids), "tokens": ids, "max_model_len": 4096})


def test_remote_tokenize_endpoint(trained_tokenizer: Path) -> None:
    handler = type("H", (_TokenizeHandler,), {"tok": LocalTokenizer(trained_tokenizer)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        remote = RemoteTokenizer(f"http://127.0.0.1:{server.server_port}")
        assert remote.model == "tiny"
        local = LocalTokenizer(trained_tokenizer)
        for endpoint in ("completions", "chat"):
            synth = PromptSynthesizer(remote, endpoint, seed=1)
            for target in (30, 333):
                built = synth.build(f"q{target}", target)
                assert built.exact
                count = (local.count_chat(built.messages) if endpoint == "chat"
                         else local.count_prompt(built.prompt))
                assert count == target
        remote.close()
        with pytest.raises(SynthesisError, match="tokenize failed"):
            RemoteTokenizer(f"http://127.0.0.1:{server.server_port}", model="other").count_prompt(
                "x")
    finally:
        server.shutdown()
        server.server_close()


def test_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(SynthesisError, match="no tokenizer.json"):
        LocalTokenizer(tmp_path)
    with pytest.raises(SynthesisError, match="unknown endpoint"):
        PromptSynthesizer(LocalTokenizer.__new__(LocalTokenizer), "embeddings")

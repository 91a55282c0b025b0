"""`localspec train` writes DIR/speculators, which vLLM's speculators library (0.9) loads as it
is and which drafts the same tokens as localspec's PyTorch model on the same features; and
`localspec convert` reads it back to the drafter `convert` makes from DIR/checkpoint."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tinymodels as tm

torch = pytest.importorskip("torch")

from localspec.training import FeatureConfig, TrainConfig, train  # noqa: E402
from localspec.training.features import load_sequences  # noqa: E402
from localspec.training.trainer import Trainer  # noqa: E402

TAPS = (1, 2, 3)


def _hf_verifier(target: str, folder: str) -> str:
    """The target in Hugging Face's layout, as far as speculators reads a verifier (its
    config, embeddings, head and final norm): what a user passes as --verifier, offline."""
    from safetensors.numpy import save_file

    from localspec.ggufdata import read_tensors
    from localspec.training.trainer import target_info

    i = target_info(target)
    w = read_tensors(target, ["token_embd.weight", "output_norm.weight"])
    os.makedirs(folder)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": i.hidden,
        "intermediate_size": i.n_ff,
        "num_attention_heads": i.n_head,
        "num_key_value_heads": i.n_head_kv,
        "num_hidden_layers": i.n_layer,
        "rms_norm_eps": i.rms_eps,
        "rope_theta": i.rope_theta,
        "vocab_size": i.n_vocab,
        "tie_word_embeddings": True,
    }
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh)
    save_file(
        {
            "model.embed_tokens.weight": np.ascontiguousarray(w["token_embd.weight"], np.float32),
            "model.norm.weight": np.ascontiguousarray(w["output_norm.weight"], np.float32),
        },
        os.path.join(folder, "model.safetensors"),
    )
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    target, _ = tm.write_agreeing_pair(str(d), head_noise=0.3, name="noisy")
    data = d / "prompts.jsonl"
    with open(data, "w", encoding="utf-8") as fh:
        for i in range(24):
            words = " ".join("abcdefghij"[(i * 7 + j) % 10] * (1 + j % 3) for j in range(8))
            fh.write(json.dumps({"messages": [{"role": "user", "content": words}]}) + "\n")
    out = str(d / "run")
    cfg = TrainConfig(
        max_steps=30,
        draft_vocab=64,
        window=64,
        batch_tokens=256,
        lr=3e-3,
        steps_unrolled=3,
        verifier=_hf_verifier(target, str(d / "verifier")),
    )
    fcfg = FeatureConfig(taps=TAPS, max_new=40, n_parallel=4, max_tokens=3000)
    train(target, [str(data)], out, config=cfg, features=fcfg, taps=TAPS, show_progress=False)
    return target, out, cfg


def test_checkpoint_has_speculators_layout(run):
    _, out, _ = run
    with open(os.path.join(out, "speculators", "config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(TAPS)  # layer inputs, as vLLM
    assert cfg["fc_norm"] and cfg["norm_output"]  # EAGLE-3.1 by default
    assert cfg["speculators_config"]["verifier"]["name_or_path"].endswith("verifier")


def test_speculators_loads_it_and_drafts_the_same_tokens(run):
    """speculators' Eagle3DraftModel, loaded from the folder as it is, teacher-forced over a
    held sequence's taps and tokens, proposes at every draft step the tokens localspec's own
    model proposes on the same features."""
    pytest.importorskip("speculators")
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    target, out, cfg = run
    path = os.path.join(out, "speculators")
    spec_cfg = Eagle3SpeculatorConfig.from_pretrained(path)
    spec_cfg.transformer_layer_config._attn_implementation = "eager"  # no flex attention on CPU
    theirs = Eagle3DraftModel.from_pretrained(path, config=spec_cfg).eval()
    ours = Trainer(target, out, TrainConfig(**{**cfg.__dict__, "max_steps": 0}), TAPS).model
    ours.eval()
    steps = cfg.steps_unrolled
    seqs = load_sequences(os.path.join(out, "data"))
    compared = ties = 0
    for s in seqs[:4]:
        T = len(s.taps) - steps  # rows whose every draft step has its true next tokens
        taps = torch.from_numpy(s.taps[:T].astype(np.float32))[None]
        nxt = torch.from_numpy(s.tokens[1 : T + steps].astype(np.int64))[None]
        with torch.no_grad():
            drafts = theirs(
                hidden_states=taps,
                input_ids=nxt[:, :T],
                document_ids=torch.zeros(1, T, dtype=torch.long),
                ttt_steps=steps,
            )
            states = ours.unroll(ours.encode(taps), nxt, steps)
        for j in range(steps):
            logits = ours.lm_head(states[j])[0, : T - j]
            mine = logits.argmax(-1)
            got = drafts[j][0, : T - j]
            # the two compute attention differently, so rounding may flip a near-tie on
            # another CPU: a differing token must be within 1e-4 of our best logit
            differ = (mine != got).nonzero().flatten()
            gaps = logits[differ, mine[differ]] - logits[differ, got[differ]]
            assert (gaps < 1e-4 * logits.abs().max()).all(), f"draft step {j + 1} differs"
            compared += T - j
            ties += len(differ)
    assert compared > 100 and ties <= compared // 100


def test_convert_reads_it_like_the_specforge_checkpoint(run):
    """The converter's reading of DIR/speculators gives the same GGUF tensors as its reading
    of DIR/checkpoint (the layout it has always read)."""
    from localspec.converters.checkpoint import load_tensors, read_config
    from localspec.converters.formats import canonical_name, parse_config

    _, out, _ = run
    read = {}
    for sub in ("checkpoint", "speculators"):
        folder = os.path.join(out, sub)
        dc = parse_config(read_config(folder))
        raw = load_tensors(folder)
        read[sub] = (dc, {canonical_name(k, dc.family): v for k, v in raw.items()})
    (a, ta), (b, tb) = read["checkpoint"], read["speculators"]
    # the same layer inputs, in each family's numbering (SpecForge counts layer outputs)
    assert a.family.taps == "outputs" and b.family.taps == "inputs"
    assert [t + 1 for t in a.tap_ids] == b.tap_ids == list(TAPS)
    assert (a.flags, a.rope_theta, a.draft_vocab_size) == (
        b.flags,
        b.rope_theta,
        b.draft_vocab_size,
    )
    for name, value in ta.items():
        if name in tb:
            np.testing.assert_array_equal(np.asarray(value), np.asarray(tb[name]), err_msg=name)
    assert {n for n in ta if n not in tb} <= {"token_embd.weight"}

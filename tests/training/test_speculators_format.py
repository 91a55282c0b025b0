"""`localspec train` writes DIR/speculators, which vLLM's speculators library (0.9) loads as it
is. Fed the target's hidden states at the layers its config names (from an independent numpy
reference of the target, in vLLM's numbering: id L is the state entering layer L) and with its
draft tokens mapped to target ids through its own d2t (target id = i + d2t[i], as vLLM maps
them), it drafts the target tokens localspec's own model drafts from the run's features, and
those are the target's own next tokens. `localspec convert` reads it back to the drafter
`convert` makes from DIR/checkpoint.

The target is the relay target (tests/helpers/tinymodels.py): every layer re-codes the token, so the
state entering each layer differs and a tap numbering one layer off hands the drafter another
code; the draft vocabulary (64 of the target's 269 ids) is not the target's first 64 ids, so a
shifted or missing map names other tokens. The last test checks that the comparison does fail
for taps one layer off either way and for a map shifted by one."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from helpers import tinymodels as tm
from helpers.trained import letter_prompts

torch = pytest.importorskip("torch")

from localspec.training import FeatureConfig, TrainConfig, train  # noqa: E402
from localspec.training.features import load_sequences  # noqa: E402
from localspec.training.trainer import Trainer  # noqa: E402

TAPS = (1, 2, 3)  # inputs of target layers (the relay target has 6)
N_SEQS = 6  # sequences of the run's data the drafts are compared on


def _hf_verifier(target: str, folder: str) -> str:
    """The target in Hugging Face's layout, as far as speculators reads a verifier (its
    config, embeddings, head and final norm): what a user passes as --verifier, offline."""
    from safetensors.numpy import save_file

    from localspec.files.ggufdata import read_tensors
    from localspec.training.targets import target_info

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
    """As tests/helpers/trained.py trains on the relay target (greedy labels, the target-layer init,
    so the drafter reads the target's state from its taps), one variant, with a verifier."""
    d = tmp_path_factory.mktemp("spec")
    target = tm.write_relay_target(str(d / "relay.gguf"))
    data = d / "prompts.jsonl"
    with open(data, "w", encoding="utf-8") as fh:
        for p in letter_prompts(48, seed=0):
            fh.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
    out = str(d / "run")
    cfg = TrainConfig(
        max_steps=80,
        eval_every=1000,
        draft_vocab=64,
        window=32,
        batch_tokens=128,
        lr=1e-3,
        steps_unrolled=3,
        init="target-layer",
        threads=1,
        verifier=_hf_verifier(target, str(d / "verifier")),
    )
    fcfg = FeatureConfig(taps=TAPS, max_new=24, n_parallel=8, max_tokens=800, top_labels=1)
    train(
        target,
        [str(data)],
        out,
        config=cfg,
        features=fcfg,
        taps=TAPS,
        n_threads=1,
        show_progress=False,
        log=lambda m: None,
    )
    return target, out, cfg


class Drafts:
    """localspec's drafter and speculators' loading of DIR/speculators, side by side on the
    first sequences of the run's data: ours from the run's own features (llama.cpp's taps at
    TAPS), theirs from the reference target's states at whatever layers it is told."""

    def __init__(self, run) -> None:
        pytest.importorskip("speculators")
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

        from helpers.reference_targets import RefTarget

        target, out, cfg = run
        path = os.path.join(out, "speculators")
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            self.config = json.load(fh)
        spec_cfg = Eagle3SpeculatorConfig.from_pretrained(path)
        spec_cfg.transformer_layer_config._attn_implementation = "eager"  # no flex attention
        self.theirs = Eagle3DraftModel.from_pretrained(path, config=spec_cfg).eval()
        trainer = Trainer(target, out, TrainConfig(**{**cfg.__dict__, "max_steps": 0}), TAPS)
        self.draft_ids = np.asarray(trainer.draft_ids, np.int64)
        self.t2d = trainer.t2d_map  # target id -> our draft index, -1 outside the vocabulary
        self.n_vocab = trainer.info.n_vocab
        ours = trainer.model.eval()
        self.steps = cfg.steps_unrolled
        self._exported: list[list[np.ndarray]] | None = None
        self.seqs = load_sequences(os.path.join(out, "data"))[:N_SEQS]
        # the reference's inputs[L] is the state entering layer L: what vLLM's aux layer id L
        # names (its llama.py records layer L-1's output under id L), and speculators with it
        ref = RefTarget(target)
        self.passes = [ref.forward(s.tokens[: len(s.taps)]) for s in self.seqs]
        self.logits: list[list[torch.Tensor]] = []  # ours, per sequence and draft step
        for s in self.seqs:
            T = len(s.taps) - self.steps  # rows whose every draft step has its true tokens
            taps = torch.from_numpy(s.taps[:T].astype(np.float32))[None]
            with torch.no_grad():
                states = ours.unroll(ours.encode(taps), self._next(s), self.steps)
                self.logits.append([ours.lm_head(states[j])[0, : T - j] for j in range(self.steps)])

    def _next(self, s) -> torch.Tensor:
        T = len(s.taps) - self.steps
        return torch.from_numpy(s.tokens[1 : T + self.steps].astype(np.int64))[None]

    def ours(self) -> list[list[np.ndarray]]:
        """Our drafts as target ids (through the run's own draft vocabulary)."""
        return [[self.draft_ids[lg.argmax(-1).numpy()] for lg in per] for per in self.logits]

    def speculators_drafts(self, layer_ids: list[int], d2t: torch.Tensor) -> list[list[np.ndarray]]:
        """speculators' drafts as target ids, fed the reference target's states entering
        layers `layer_ids`, mapped through `d2t` as vLLM maps them."""
        out = []
        for s, p in zip(self.seqs, self.passes, strict=True):
            T = len(s.taps) - self.steps
            taps = np.concatenate([p.inputs[i, :T] for i in layer_ids], -1)
            nxt = self._next(s)
            with torch.no_grad():
                drafts = self.theirs(
                    hidden_states=torch.from_numpy(taps.astype(np.float32))[None],
                    input_ids=nxt[:, :T],
                    document_ids=torch.zeros(1, T, dtype=torch.long),
                    ttt_steps=self.steps,
                )
            to_target = (torch.arange(len(d2t)) + d2t).numpy()
            out.append([to_target[drafts[j][0, : T - j].numpy()] for j in range(self.steps)])
        return out

    def exported(self) -> list[list[np.ndarray]]:
        """speculators' drafts at the layers and through the map the export names."""
        if self._exported is None:
            ids = self.config["eagle_aux_hidden_state_layer_ids"]
            self._exported = self.speculators_drafts(ids, self.theirs.d2t)
        return self._exported

    def agreement(self, drafts: list[list[np.ndarray]]) -> float:
        """The share of draft tokens that equal ours."""
        pairs = [
            (a, b)
            for x, y in zip(drafts, self.ours(), strict=True)
            for a, b in zip(x, y, strict=True)
        ]
        return sum(int((a == b).sum()) for a, b in pairs) / sum(len(a) for a, _ in pairs)


@pytest.fixture(scope="module")
def drafts(run) -> Drafts:
    return Drafts(run)


def test_checkpoint_has_speculators_layout(run):
    _, out, _ = run
    with open(os.path.join(out, "speculators", "config.json"), encoding="utf-8") as fh:
        cfg = json.load(fh)
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(TAPS)  # layer inputs, as vLLM
    assert cfg["fc_norm"] and cfg["norm_output"]  # EAGLE-3.1 by default
    assert cfg["speculators_config"]["verifier"]["name_or_path"].endswith("verifier")


def test_the_map_speculators_loads_is_the_runs_draft_vocabulary(drafts):
    """speculators loads the exported d2t and t2d: a draft vocabulary smaller than the target's
    and not its first ids (vLLM leaves its map at zeros, silently, for a checkpoint without
    d2t), naming exactly the run's draft tokens in its order."""
    d = drafts
    d2t, t2d = d.theirs.d2t.numpy(), d.theirs.t2d.numpy()
    assert len(d2t) == 64 < d.n_vocab and d2t.any()
    np.testing.assert_array_equal(np.arange(len(d2t)) + d2t, d.draft_ids)
    np.testing.assert_array_equal(np.flatnonzero(t2d), np.sort(d.draft_ids))


def test_speculators_drafts_our_tokens_from_the_targets_taps(drafts):
    """At every draft step, teacher-forced over the run's first sequences, speculators' model
    given the target's states at the exported layer ids proposes (through the exported map)
    the target tokens localspec's model proposes from the run's features. The two compute
    attention differently and the taps were stored as float16, so rounding may flip a
    near-tie: a differing token must be within 1e-4 of our best logit, and at most 1% may
    differ."""
    d = drafts
    compared = 0
    ties = np.zeros(d.steps, int)  # differing tokens within the tolerance, per draft step
    far = np.zeros(d.steps, int)  # and beyond it
    for per_seq, ours_seq, logits_seq in zip(d.exported(), d.ours(), d.logits, strict=True):
        for j, (got, mine, logits) in enumerate(zip(per_seq, ours_seq, logits_seq, strict=True)):
            differ = np.flatnonzero(got != mine)
            at = d.t2d[got[differ]]  # their token in our draft vocabulary (-1: not in it)
            best = logits[differ, d.t2d[mine[differ]]]
            gaps = np.where(at >= 0, (best - logits[differ, np.maximum(at, 0)]).numpy(), np.inf)
            near = gaps < 1e-4 * float(logits.abs().max())
            ties[j] += int(near.sum())
            far[j] += int((~near).sum())
            compared += len(got)
    assert compared > 200 and not far.any() and ties.sum() <= compared // 100, (far, ties)


def test_speculators_drafts_are_the_targets_next_tokens(drafts):
    """Not degenerate: on the replies (the rows the drafter was trained on), speculators'
    drafts mapped to target ids are the target's own greedy next tokens (from the reference)
    at every draft step (all of them here, as ours)."""
    d = drafts
    hits = np.zeros(d.steps)
    rows = np.zeros(d.steps)
    for s, p, per_seq in zip(d.seqs, d.passes, d.exported(), strict=True):
        greedy = p.logits.argmax(-1)  # the target's choice after each position
        for j, got in enumerate(per_seq):
            # row i drafts position i + 2 + j: the target's choice after position i + 1 + j
            want = greedy[1 + j : 1 + j + len(got)]
            keep = s.labelled[1 + j : 1 + j + len(got)]
            hits[j] += int((got == want)[keep].sum())
            rows[j] += int(keep.sum())
    rate = hits / rows
    assert rows.min() > 50 and (rate >= 0.9).all(), rate


@pytest.mark.parametrize(
    "wrong", ["taps a layer deeper", "taps a layer shallower", "map +1", "no map"]
)
def test_the_comparison_tells_taps_or_a_map_one_off(drafts, wrong):
    """The comparison above is not blind: the same drafts with the taps one layer off either
    way, with the map shifted by one id, or with none (what vLLM uses for a checkpoint without
    d2t) agree with ours on fewer than half the tokens (10-17% for the taps, none for the maps
    here), where the export's own agree on more than 98%."""
    d = drafts
    ids = list(d.config["eagle_aux_hidden_state_layer_ids"])
    d2t = d.theirs.d2t
    if wrong == "taps a layer deeper":
        ids = [i + 1 for i in ids]
    elif wrong == "taps a layer shallower":
        ids = [i - 1 for i in ids]
    elif wrong == "map +1":
        d2t = d2t + 1
    else:
        d2t = torch.zeros_like(d2t)
    assert d.agreement(d.speculators_drafts(ids, d2t)) < 0.5
    assert d.agreement(d.exported()) > 0.98


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

"""What a GGUF file is: a target, a drafter, its sizes, taps, EAGLE-3.1 flags and pairing.

Reads only the header (ggml's C reader), so it is instant even for large models.
"""

from __future__ import annotations

import collections
from typing import Any

import gguf

from .. import native as N
from ..options import RuntimeOptions
from ..runtime.drafter_spec import DrafterSpec
from ..runtime.mtp import mtp_blocks
from ..runtime.rollback import (
    CHECKPOINT_DRAFT,
    SNAPSHOT_TAX,
    plan_rollback,
    size_text,
    tree_branches,
)
from ..runtime.taps import GRAPH, STAGING, route_for
from ..speculation.sampling import GGUF_SAMPLING, recommended
from . import gguf_keys as K


def _type_name(ggml_type: int) -> str:
    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def _file_type_name(ft: Any) -> str | None:
    if not isinstance(ft, int):
        return None
    try:
        return gguf.LlamaFileType(ft).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(ft)


def describe(path: str) -> dict[str, Any]:
    """A JSON-ready description of a GGUF target or eagle3 drafter."""
    h = N.GGUFHeader(path)
    arch = h.architecture or "unknown"
    types = collections.Counter(_type_name(t.ggml_type) for t in h.tensors.values())
    n_params = sum(_numel(t.shape) for t in h.tensors.values())
    info: dict[str, Any] = {
        "path": path,
        "kind": "drafter" if arch == K.EAGLE3_ARCH else "target",
        "architecture": arch,
        "name": h.kv.get(gguf.Keys.General.NAME),
        "file_size": h.file_size,
        "parameters": n_params,
        "file_type": _file_type_name(h.kv.get(gguf.Keys.General.FILE_TYPE)),
        "tensor_types": dict(types.most_common()),
        "context_length": h.arch_key("context_length"),
        "block_count": h.arch_key("block_count"),
        "embedding_length": h.arch_key("embedding_length"),
        "feed_forward_length": h.arch_key("feed_forward_length"),
        "head_count": h.arch_key("attention.head_count"),
        "head_count_kv": h.arch_key("attention.head_count_kv"),
        "vocab_size": h.kv_len.get(gguf.Keys.Tokenizer.LIST),
        "tokenizer": h.kv.get(gguf.Keys.Tokenizer.MODEL),
        "chat_template": gguf.Keys.Tokenizer.CHAT_TEMPLATE in h.kv,
    }
    if info["kind"] == "target":  # what generate, chat and serve sample with
        sp, notes = recommended(lambda k: None if (v := h.kv.get(k)) is None else str(v))
        info["sampling"] = {
            "settings": sp.describe(),
            # the keys taken (a value refused is in the notes instead)
            "from_model": sorted(
                k for k in GGUF_SAMPLING if h.kv.get(k) is not None and k not in notes
            ),
            "notes": list(notes.values()),
        }
    if arch == K.EAGLE3_ARCH:
        spec = DrafterSpec(path)
        info["drafter"] = {
            "variant": spec.variant,
            "taps": list(spec.taps),
            "target_hidden_size": spec.target_hidden,
            "fc_norm": spec.fc_norm,
            "norm_output": spec.norm_output,
            "norm_before_fc": spec.norm_before_fc,
            "norm_before_residual": spec.norm_before_residual,
            "draft_vocab": spec.draft_vocab,
            "attention_window": spec.attention_window,
            "own_token_embd": spec.has_token_embd,
            "own_output": spec.has_output,
            "made_for": {k: v for k, v in spec.target_record.items() if v is not None} or None,
        }
    else:
        info["taps_via"] = route_for(arch)
        info["mtp_blocks"], why = mtp_blocks(h)
        info["mtp_unusable"] = (why or None) if info["mtp_blocks"] else None
        if arch in K.RECURRENT_ARCHS:
            info["recurrent"] = _recurrent(h, arch, info)
    return info


def _recurrent(h: Any, arch: str, info: dict[str, Any]) -> dict[str, Any]:
    """Whether drafts can be verified on a hybrid or recurrent target: the snapshots of its
    recurrent state it keeps at the default n_batch (the weights' size: the file's)."""
    n_embd = info["embedding_length"] if isinstance(info["embedding_length"], int) else 0
    plan = plan_rollback(
        arch,
        h.arch_key,
        n_embd=n_embd,
        n_batch=RuntimeOptions().n_batch,
        weights_bytes=info["file_size"],
    )
    # draft trees: a state per branch, each with its snapshots (checkpoints: none)
    branches, no_trees = tree_branches(plan, info["file_size"], RuntimeOptions().n_batch)
    return {
        "rollback": plan.n_rs_seq > 0,
        "checkpoint": plan.checkpoint,
        "tree_branches": branches,
        "branch_bytes": (1 + plan.n_rs_seq) * plan.row_bytes if branches else None,
        "no_trees": no_trees or None,
        "snapshots": plan.n_rs_seq,
        "snapshot_bytes": plan.memory,
        "row_bytes": plan.row_bytes,
        "why_not": plan.why_not or None,
        "lowered": plan.lowered or None,
    }


def _trees(r: dict[str, Any]) -> str:
    """What `info` says of draft trees on a recurrent target."""
    if r.get("tree_branches"):
        return (
            f"; draft trees of up to {r['tree_branches']} branches, each verified in a "
            f"sequence of its own ({size_text(r['branch_bytes'])} of state each)"
        )
    return f"; draft chains only ({r['no_trees']})" if r.get("no_trees") else ""


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


TAPS_VIA = {
    STAGING: "through llama.cpp's staging API (its graph records layer inputs)",
    GRAPH: "through the graph's eval callback (layer outputs l_out-<il>; checked at load)",
}


def format_info(info: dict[str, Any]) -> str:
    """The human-readable form `localspec info` prints."""
    mib = info["file_size"] / 2**20
    lines = [
        f"{info['path']}",
        f"  kind          {info['kind']} ({info['architecture']})"
        + (f", {info['name']}" if info.get("name") else ""),
        f"  size          {mib:.1f} MiB, {info['parameters'] / 1e6:.2f} M parameters",
        "  quantization  "
        + (f"{info['file_type']}; " if info.get("file_type") else "")
        + ", ".join(f"{k} x{v}" for k, v in info["tensor_types"].items()),
        f"  shape         {info['block_count']} layer(s), hidden {info['embedding_length']}, "
        f"ffn {info['feed_forward_length']}, heads {info['head_count']}/{info['head_count_kv']} "
        f"(q/kv), context {info['context_length']}",
        f"  vocabulary    {info['vocab_size']} tokens ({info['tokenizer']}), chat template: "
        + ("yes" if info["chat_template"] else "no"),
    ]
    d = info.get("drafter")
    if d is None:
        s = info.get("sampling")
        if s is not None:
            whose = (
                "the model's general.sampling.*, llama.cpp's defaults for the rest"
                if s["from_model"]
                else "llama.cpp's defaults: the model recommends none"
            )
            lines.append(f"  sampling      {s['settings']} ({whose}; generate, chat, serve)")
            lines += [f"                note: {n}" for n in s["notes"]]
        lines.append(f"  EAGLE-3 taps  {TAPS_VIA[info['taps_via']]}")
        r = info.get("recurrent")
        if r is not None and r["rollback"]:
            lowered = f"; fewer than usual: {r['lowered']}" if r["lowered"] else ""
            lines.append(
                f"  recurrent     hybrid: its state is cut back after rejected drafts by "
                f"{r['snapshots']} snapshots ({size_text(r['snapshot_bytes'])}, "
                f"{size_text(r['row_bytes'])} each){lowered}; chains of at most "
                f"{r['snapshots']} tokens; under auto they are timed once here, and where "
                f"they cost a plain step over {SNAPSHOT_TAX:.0%} each draft is verified from a "
                "checkpoint instead" + _trees(r)
            )
        elif r is not None and r.get("checkpoint"):
            lines.append(
                "  recurrent     no snapshots: each draft is verified from a checkpoint of its "
                "state and the accepted tokens are decoded again after a rejection (auto "
                f"drafts where that pays; chains of at most {CHECKPOINT_DRAFT} tokens)" + _trees(r)
            )
        elif r is not None:
            lines.append(f"  recurrent     plain decoding only: {r['why_not']}")
        m = info.get("mtp_blocks")
        if m:
            blocks = "1 block" if m == 1 else f"{m} blocks (the first drafts)"
            if info.get("mtp_unusable"):
                lines.append(f"  MTP head      {blocks}, unused: {info['mtp_unusable']}")
            else:
                lines.append(
                    f"  MTP head      {blocks}: drafts with --draft-source mtp (auto uses it "
                    "when no EAGLE drafter is found)"
                )
        return "\n".join(lines)
    flags = [
        f for f in ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual") if d[f]
    ]
    lines += [
        f"  variant       {d['variant']}" + (f" ({', '.join(flags)})" if flags else ""),
        f"  taps          inputs of target layers {d['taps']} "
        f"(target hidden {d['target_hidden_size']})",
        "  draft vocab   "
        + (f"{d['draft_vocab']} tokens (d2t)" if d["draft_vocab"] else "the target's, no d2t"),
        "  embeddings    "
        + ("own" if d["own_token_embd"] else "borrowed from the target")
        + ", output head "
        + ("own" if d["own_output"] else "borrowed from the target"),
        "  attends over  "
        + (
            f"its last {d['attention_window']} pairs (the window it was trained over)"
            if d["attention_window"]
            else "the whole history"
        ),
    ]
    m = d["made_for"]
    if m:
        fp = str(m.get("vocab_fingerprint", ""))[:12]
        lines.append(
            f"  made for      {m.get('architecture')} target, {m.get('block_count')} layers, "
            f"hidden {m.get('embedding_length')}, {m.get('vocab_size')} tokens (vocab {fp}...)"
        )
    else:
        lines.append("  made for      not recorded (checked by tokenizer when paired)")
    return "\n".join(lines)


def check_pairing(drafter_path: str, target_path: str) -> str | None:
    """None when the drafter pairs with the target, else the reason it does not."""
    from ..errors import LocalspecError
    from ..options import RuntimeOptions
    from ..runtime.target import Target

    spec = DrafterSpec(drafter_path)
    target = Target(target_path, RuntimeOptions(n_ctx=256, n_batch=32, n_threads=1))
    try:
        spec.check_pair(target)
    except LocalspecError as exc:
        return str(exc)
    finally:
        target.close()
    return None

"""`localspec convert`: an EAGLE-3 / EAGLE-3.1 drafter checkpoint -> an eagle3 GGUF.

The target is the user's GGUF: its architecture, layers, hidden size and tokenizer come from
it, so no Hugging Face copy of the target is needed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import gguf
import numpy as np

from localspec import native as N
from localspec.errors import (
    CheckpointError,
    InvalidParameterError,
    LocalspecError,
)
from localspec.files import gguf_keys as K
from localspec.files.discovery import drafter_path_for
from localspec.native.hardware import physical_cores
from localspec.stats import Stats

from . import formats as F
from .checkpoint import load_tensors, read_config
from .eagle3_gguf import Eagle3Config, set_reading, write_eagle3_gguf
from .measure import MeasureConfig, Measured, choose, measure
from .verify import VerifyReport, acceptance, verify

# output types gguf-py writes itself, and the K-quants that go through llama.cpp's quantizer
DIRECT_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
LLAMA_FTYPES = {
    "q2_k": 10, "q3_k_s": 11, "q3_k_m": 12, "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15,
    "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18,
}  # fmt: skip
OUTTYPES = DIRECT_TYPES + tuple(LLAMA_FTYPES)


@dataclass
class ConvertResult:
    path: str
    family: str
    taps: list[int]
    taps_source: str
    flags: dict[str, bool]
    outtype: str
    draft_vocab: int | None
    verify: VerifyReport | None = None
    acceptance: Stats | None = None
    readings: list[Measured] = field(default_factory=list)  # when the config left a choice
    choice: str = ""  # why the written reading was chosen


def resolve_source(drafter: str, log: Callable[[str], None] = print) -> str:
    """A local checkpoint folder, or a Hugging Face repo id ``org/name[@revision]`` fetched
    into the normal hub cache (HF_HUB_OFFLINE, HF_TOKEN and HF_HOME are honoured)."""
    if os.path.isdir(drafter):
        return drafter
    if os.path.exists(drafter):
        raise CheckpointError(f"{drafter} is a file; give the checkpoint's folder or a repo id")
    repo, _, revision = drafter.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise CheckpointError(f"{drafter} is neither a folder nor a repo id like org/name[@rev]")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            "downloading needs huggingface-hub (pip install huggingface-hub)"
        ) from None
    log(f"fetching {repo}" + (f"@{revision}" if revision else "") + " from the Hugging Face hub")
    try:
        return snapshot_download(
            repo,
            revision=revision or None,
            allow_patterns=["*.json", "*.safetensors", "*.bin"],
        )
    except Exception as exc:  # offline, not found, gated, network errors
        raise CheckpointError(f"cannot fetch {drafter}: {exc}") from None


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face rotate-half q/k rows -> llama.cpp's interleaved RoPE layout."""
    out, inp = w.shape
    return w.reshape(n_head, 2, out // n_head // 2, inp).swapaxes(1, 2).reshape(out, inp)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """permute_qk undone: llama.cpp's interleaved RoPE rows -> Hugging Face rotate-half."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def _np(t: Any) -> np.ndarray:
    import torch

    if t.dtype in (torch.int64, torch.int32, torch.bool):
        return t.numpy()
    return t.to(torch.float32).numpy()


def build_tensors(
    dc: F.DrafterConfig, src: dict[str, Any], target_hidden: int, target_vocab: int
) -> dict[str, np.ndarray]:
    """Map, check, permute and fold the checkpoint's tensors into eagle3 GGUF tensors."""
    t = {F.canonical_name(k, dc.family): v for k, v in src.items()}
    for name in t:
        for frag, what in F.UNSUPPORTED_TENSORS.items():
            if frag in name:
                raise CheckpointError(f"llama.cpp's eagle3 graph cannot run {what} ({name})")
        if name not in F.TENSOR_MAP and name not in F.SPECIAL:
            if name.startswith(("L.", "layers.", "midlayer")):
                raise CheckpointError(f"unexpected tensor {name}: is this a one-layer drafter?")
            raise CheckpointError(f"unexpected tensor {name} in the checkpoint")
    missing = [k for k in F.REQUIRED if k not in t]
    if missing:
        raise CheckpointError("checkpoint lacks tensor(s): " + ", ".join(missing))

    h, ff, nh, nkv = dc.hidden_size, dc.intermediate_size, dc.n_head, dc.n_head_kv
    hd = h // nh
    fc_in = int(t["fc.weight"].shape[-1])
    if fc_in != 3 * target_hidden:
        cfg_says = dc.target_hidden_size
        said = f" (config target_hidden_size {cfg_says})" if cfg_says else ""
        raise CheckpointError(
            f"the drafter's fc reads 3 x {fc_in / 3:g} target features{said}; the target has "
            f"hidden size {target_hidden}: it was trained for another target"
        )
    shapes = {
        "fc.weight": (h, 3 * target_hidden),
        "L.input_layernorm.weight": (h,),
        "L.hidden_norm.weight": (h,),
        "L.post_attention_layernorm.weight": (h,),
        "L.self_attn.q_proj.weight": (nh * hd, 2 * h),
        "L.self_attn.k_proj.weight": (nkv * hd, 2 * h),
        "L.self_attn.v_proj.weight": (nkv * hd, 2 * h),
        "L.self_attn.o_proj.weight": (h, nh * hd),
        "L.mlp.gate_proj.weight": (ff, h),
        "L.mlp.up_proj.weight": (ff, h),
        "L.mlp.down_proj.weight": (h, ff),
        "norm.weight": (h,),
        "input_norm.weight": (3 * target_hidden,),
        "embed_tokens.weight": (target_vocab, h),
    }
    shapes.update({f"fc_norm.{i}.weight": (target_hidden,) for i in range(3)})
    out: dict[str, np.ndarray] = {}
    for name, want in shapes.items():
        if name in t and tuple(t[name].shape) != want:
            raise CheckpointError(
                f"tensor {name} has shape {tuple(t[name].shape)}, expected {want}"
            )

    # the head and the draft vocabulary
    d2t = t.get("d2t")
    head = t.get("lm_head.weight")
    n_head_rows = int(head.shape[0]) if head is not None else target_vocab
    if head is not None and tuple(head.shape[1:]) != (h,):
        raise CheckpointError(f"tensor lm_head.weight has shape {tuple(head.shape)}")
    if d2t is None and n_head_rows != target_vocab:
        raise CheckpointError(
            f"the head has {n_head_rows} rows but the target has {target_vocab} tokens and "
            "there is no d2t mapping"
        )
    if d2t is not None:
        off = _np(d2t).astype(np.int64).reshape(-1)
        if off.shape[0] != n_head_rows:
            raise CheckpointError(f"d2t has {off.shape[0]} entries; the head has {n_head_rows}")
        ids = np.arange(off.shape[0], dtype=np.int64) + off  # offsets -> absolute target ids
        if ids.min() < 0 or ids.max() >= target_vocab:
            raise CheckpointError(f"d2t maps to ids outside the target's 0..{target_vocab - 1}")
        if np.unique(ids).shape[0] != ids.shape[0]:
            raise CheckpointError("d2t maps two draft tokens to the same target token")
        out[K.T_D2T] = ids

    fc = _np(t["fc.weight"])
    fc_norms = [t.get(f"fc_norm.{i}.weight") for i in range(3)]
    if dc.flags["fc_norm"]:
        if any(w is None for w in fc_norms):
            raise CheckpointError("config sets fc_norm but fc_norm.{0,1,2}.weight are missing")
        # W_fc [w0*a0/r0; w1*a1/r1; w2*a2/r2] = (W_fc diag(w)) [a0/r0; ...]: fold exactly
        fc = fc * np.concatenate([_np(w) for w in fc_norms])[None, :]
    elif any(w is not None for w in fc_norms):
        raise CheckpointError("checkpoint has fc_norm weights but its config does not set fc_norm")
    if dc.flags["norm_before_fc"] and "input_norm.weight" not in t:
        raise CheckpointError("config sets norm_before_fc but input_norm.weight is missing")
    out["fc.weight"] = fc
    if dc.rope_scaling is not None:
        factors = F.llama3_rope_factors(dc.rope_scaling, dc.rope_theta, hd)
        out["rope_freqs.weight"] = np.array(factors, dtype=np.float32)

    for name, gguf_name in F.TENSOR_MAP.items():
        if name in ("fc.weight",) or name not in t:
            continue
        if name == "input_norm.weight" and not dc.flags["norm_before_fc"]:
            raise CheckpointError("checkpoint has input_norm.weight but norm_before_fc is off")
        arr = _np(t[name])
        if name == "L.self_attn.q_proj.weight":
            arr = permute_qk(arr, nh)
        elif name == "L.self_attn.k_proj.weight":
            arr = permute_qk(arr, nkv)
        out[gguf_name] = arr
    return out


def _cast(tensors: dict[str, np.ndarray], outtype: str) -> dict[str, np.ndarray]:
    """Matrices to the float type; norms (1-D) stay F32 and d2t stays I64."""
    res = {}
    for name, arr in tensors.items():
        if arr.ndim == 1 or arr.dtype == np.int64:
            res[name] = arr.astype(np.float32) if arr.dtype != np.int64 else arr
        elif outtype == "f16":
            res[name] = arr.astype(np.float16)
        else:
            res[name] = arr.astype(np.float32)
    return res


def convert(
    drafter: str,
    target: str,
    out: str | None = None,
    *,
    outtype: str = "f16",
    taps: list[int] | None = None,
    flags: dict[str, bool] | None = None,
    measure_readings: MeasureConfig | bool = True,
    force: bool = False,
    check: bool = True,
    check_acceptance: bool = False,
    log: Callable[[str], None] = print,
) -> ConvertResult:
    """Convert a drafter checkpoint (folder or repo id) for TARGET.gguf; returns what it did.

    taps / flags (norm_output, norm_before_residual): take these as given instead of reading
    them from the config. measure_readings: where the config leaves the tap numbering or a
    flag's meaning open, draft for the target under every reading and keep the one it accepts
    most (a MeasureConfig sets prompts and lengths); False takes the layout's convention and
    says that it guessed. check: compare the GGUF with a PyTorch reference of the checkpoint
    and refuse to write it below the output type's threshold. check_acceptance: also report the
    acceptance of the written drafter on a few prompts."""
    if outtype not in OUTTYPES:
        raise InvalidParameterError(f"--outtype must be one of {', '.join(OUTTYPES)}")
    th = N.GGUFHeader(target, max_str_array=0)
    arch = th.architecture or "unknown"
    if arch == K.EAGLE3_ARCH:
        raise InvalidParameterError(f"{target} is a drafter; give the target GGUF")
    # the trunk's layers: MTP (nextn) blocks after it are counted in block_count too
    nextn = th.arch_key("nextn_predict_layers")
    n_layer = int(th.arch_key("block_count") or 0) - (nextn if isinstance(nextn, int) else 0)
    t_hidden = int(th.arch_key("embedding_length") or 0)
    t_vocab = int(th.kv_len.get(gguf.Keys.Tokenizer.LIST, 0))
    out = out or drafter_path_for(target)
    if os.path.exists(out) and not force:
        raise InvalidParameterError(f"{out} exists; pass --force to overwrite it")
    folder = os.path.dirname(os.path.abspath(out))
    _check_writable(folder, out)
    if taps is not None and (len(taps) != 3 or any(not 0 <= x < n_layer for x in taps)):
        raise InvalidParameterError(
            f"taps {list(taps)} must be 3 layer ids in 0..{n_layer - 1} for this target"
        )
    if flags and any(f not in F.SETTABLE_FLAGS for f in flags):
        raise InvalidParameterError(f"settable flags: {', '.join(F.SETTABLE_FLAGS)}")

    src = resolve_source(drafter, log)
    dc = F.parse_config(read_config(src))
    if dc.target_hidden_size is not None and dc.target_hidden_size != t_hidden:
        raise CheckpointError(
            f"the drafter was trained on a target with hidden size {dc.target_hidden_size}; "
            f"{target} has {t_hidden}"
        )
    candidates = F.readings(dc, n_layer, taps=taps, flags=flags)
    log(f"{dc.family.name} checkpoint (written by {dc.family.writers})")
    source = load_tensors(src)
    tensors = build_tensors(dc, source, t_hidden, t_vocab)
    for note in dc.notes:
        log(f"note: {note}")

    first = candidates[0]
    cfg = Eagle3Config(
        n_embd=dc.hidden_size,
        n_ff=dc.intermediate_size,
        n_head=dc.n_head,
        n_head_kv=dc.n_head_kv,
        rms_eps=dc.rms_eps,
        rope_theta=dc.rope_theta,
        context_length=dc.context_length,
        target_layers=first.taps,
        target_hidden=t_hidden,
        norm_before_fc=dc.flags["norm_before_fc"],
        norm_before_residual=first.flag_dict["norm_before_residual"],
        fc_norm=dc.flags["fc_norm"],
        fc_norm_eps=dc.rms_eps,
        norm_output=first.flag_dict["norm_output"],
        attention_window=dc.attention_window,
    )
    name = f"EAGLE drafter ({dc.family.name}) for {os.path.basename(target)}"
    draft_vocab = int(tensors[K.T_D2T].shape[0]) if K.T_D2T in tensors else None
    # write next to the destination, check, and only then rename into place
    fd, tmp = tempfile.mkstemp(prefix=".localspec-", suffix=".gguf", dir=folder)
    os.close(fd)
    try:
        if outtype in LLAMA_FTYPES:
            _write_k_quant(tmp, cfg, tensors, target, name, outtype)
        else:
            write_eagle3_gguf(tmp, cfg, _quantize(tensors, outtype), target, name=name)
        chosen, measured, why = _settle(tmp, target, candidates, measure_readings, log)
        dc = replace(dc, flags=chosen.flag_dict)
        res = ConvertResult(
            out, dc.family.name, list(chosen.taps), chosen.why, dc.flags, outtype, draft_vocab
        )
        res.readings, res.choice = measured, why
        log(f"taps (input of layer) {list(chosen.taps)}: {chosen.why}")
        log("flags: " + ", ".join(f"{k}={v}" for k, v in dc.flags.items()))
        if check:
            res.verify = verify(tmp, target, dc, source, outtype)
            log(res.verify.summary())
            if not res.verify.passed:
                raise CheckpointError(
                    "the converted drafter disagrees with the checkpoint; nothing written ("
                    + res.verify.summary()
                    + ")"
                )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log(f"wrote {out} ({outtype})")
    if check_acceptance:
        res.acceptance = acceptance(target, out)
        st = res.acceptance
        log(
            f"acceptance on {st.generations} prompts: "
            f"{100 * st.acceptance_rate:.1f}% of drafts, tau {st.tau:.2f}, per position "
            + " ".join(f"{100 * a:.0f}%" for a in st.acceptance_at)
        )
    return res


def _settle(
    path: str,
    target: str,
    candidates: list[F.Reading],
    how: MeasureConfig | bool,
    log: Callable[[str], None],
) -> tuple[F.Reading, list[Measured], str]:
    """The reading to write (the file is left in its state), what was measured, and why."""
    if len(candidates) == 1:
        return candidates[0], [], "the config is unambiguous"
    if how is False:
        kept = candidates[0]
        why = (
            f"NOT MEASURED: the config can be read {len(candidates)} ways and this is a guess, "
            f"the layout's convention ({kept.why}); pass --taps and the flag options to be sure"
        )
        log(why)
        set_reading(path, kept.taps, kept.flag_dict)
        return kept, [], why
    cfg = how if isinstance(how, MeasureConfig) else MeasureConfig()
    log(
        f"the config can be read {len(candidates)} ways; measuring the target's acceptance of "
        f"each ({len(cfg.prompts)} prompt(s), chains of {cfg.n_draft}, {cfg.max_tokens} tokens):"
    )
    measured = measure(path, target, candidates, cfg, log)
    best, why = choose(measured)
    log(why)
    set_reading(path, best.reading.taps, best.reading.flag_dict)
    return best.reading, measured, why


def _check_writable(folder: str, out: str) -> None:
    """Create and remove a file where the output goes, before any work: permission bits do
    not tell root the truth (a read-only or pseudo file system), a real file does."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".localspec-", suffix=".probe", dir=folder)
    except OSError as exc:
        raise InvalidParameterError(f"cannot write {out}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)


def _quantize(tensors: dict[str, np.ndarray], outtype: str) -> dict[str, Any]:
    """Float types and the block quants gguf-py implements; norms and d2t stay exact."""
    import gguf

    if outtype in ("f32", "f16"):
        return _cast(tensors, outtype)
    qtype = gguf.GGMLQuantizationType[outtype.upper()]
    res: dict[str, Any] = {}
    for name, arr in _cast(tensors, "f32").items():
        if arr.ndim == 2 and arr.shape[1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
            res[name] = (gguf.quants.quantize(arr, qtype), qtype)
        else:
            res[name] = arr.astype(np.float16) if arr.ndim == 2 else arr
    return res


def _write_k_quant(
    out: str,
    cfg: Eagle3Config,
    tensors: dict[str, np.ndarray],
    target: str,
    name: str,
    outtype: str,
) -> None:
    """K-quants go through llama.cpp's own quantizer from an F32 intermediate file."""
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp_in = tempfile.mkstemp(prefix=".localspec-", suffix=".f32.gguf", dir=folder)
    os.close(fd)
    fd, tmp_out = tempfile.mkstemp(prefix=".localspec-", suffix=".gguf.part", dir=folder)
    os.close(fd)
    try:
        write_eagle3_gguf(tmp_in, cfg, _cast(tensors, "f32"), target, name=name)
        try:
            N.quantize_model(tmp_in, tmp_out, LLAMA_FTYPES[outtype], physical_cores())
        except LocalspecError as exc:
            raise CheckpointError(f"{exc} ({outtype})") from None
        os.replace(tmp_out, out)
    finally:
        for p in (tmp_in, tmp_out):
            if os.path.exists(p):
                os.unlink(p)

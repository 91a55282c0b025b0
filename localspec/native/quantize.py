"""llama.cpp's own quantizer, behind the header checks its loader needs."""

from __future__ import annotations

import os

from ..errors import GenerationError
from .gguf_header import GGUFHeader
from .library import C, clear_log, last_errors


def quantize_model(src: str, dst: str, ftype: int, n_threads: int) -> None:
    """llama.cpp's own quantizer: src GGUF -> dst GGUF of file type ftype (LLAMA_FTYPE_*)."""
    params = C.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads
    from .header_checks import check_header  # it imports this module

    check_header(GGUFHeader(src))  # the quantizer reads hparams as the loader does
    clear_log()
    if C.llama_model_quantize(os.fsencode(src), os.fsencode(dst), params) != 0:
        raise GenerationError(f"llama.cpp's quantizer failed: {last_errors() or 'no detail'}")

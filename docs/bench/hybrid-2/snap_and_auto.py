"""Plain decoding on an engine loaded for it (draft_source none: no snapshots), on a drafting
engine with n_draft=0 (snapshots kept, nothing drafted) and auto on that engine, interleaved per
prompt and round (rotated order) over the copy-wide set: decode tok/s medians, the median and
lowest per-request ratio to plain, and the median prefill. Then what one refresh of auto's
reason costs. Usage: python snap_and_auto.py TARGET.gguf ROUNDS"""
import sys, time, statistics
sys.path.insert(0, "tests")
import localspec
from localspec.bench import load_prompt_set
p = sys.argv[1]
prompts = load_prompt_set("copy-wide", 18)
e0 = localspec.load(p, draft=False, draft_source="none", n_ctx=4096, n_threads=2)
e1 = localspec.load(p, draft=False, draft_source="auto", n_ctx=4096, n_threads=2)
cfg = [("plain", e0, {"n_draft":0}), ("snap", e1, {"n_draft":0}), ("auto", e1, {})]
res = {k:[] for k,_,_ in cfg}; pre={k:[] for k,_,_ in cfg}
for r in range(int(sys.argv[2])):
    for i,bp in enumerate(prompts):
        msgs = list(bp.history)+[{"role":"user","content":bp.turns[0]}]
        order = cfg[(r+i)%3:]+cfg[:(r+i)%3]
        for k,e,g in order:
            e.reset(); c=e.chat(msgs, max_tokens=128, temperature=0.0, **g)
            res[k].append(c.stats.generated/c.stats.t_decode); pre[k].append(c.stats.t_prefill)
for k in res:
    ratios=[a/b for a,b in zip(res[k],res["plain"])]
    print(k, "decode tok/s median", round(statistics.median(res[k])), "x plain median", round(statistics.median(ratios),3), "min", round(min(ratios),3), "prefill ms median", round(1000*statistics.median(pre[k]),2))

import time
from localspec.lowlevel import parts
e1.complete("the cat sat on the mat", max_tokens=64)  # auto last: its reason is what is timed
sch = parts(e1).scheduler
assert sch.explain() is not None
t = time.perf_counter()
for _ in range(200):
    sch.explain()
print("auto's reason, one refresh:", round((time.perf_counter() - t) / 200 * 1e6), "us")

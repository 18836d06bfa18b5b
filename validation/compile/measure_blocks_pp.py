#!/usr/bin/env python
"""Per-block ``torch.compile`` under pipeline parallelism (torchtitan compiles each block of each stage's model
chunk: parallelize_llama.py ``apply_compile`` on the stage's module), one stage measured alone with the profiler's
memory timeline, on torchtune's own builder, eager and compiled.

    nice -n 10 /tmp/lossvenv/bin/python validation/compile/measure_blocks_pp.py [--only ID ...]
    # writes validation/compile/blocks_pp_measurements.json; /tmp/lossvenv as measure_blocks.py's

Each configuration is stage ``stage`` of ``pp`` stages (an even split of the layers), run in one process with
nothing of the other stages: the first stage keeps the token embedding, the last the final norm, the LM head
(``self.output(h).float()``, as ``TransformerDecoder.forward``) and the loss (``nn.CrossEntropyLoss`` on the
shifted labels, as measure_blocks.py's ``Step``); ``compile: blocks``: each of the stage's
``TransformerSelfAttentionLayer``s ``torch.compile``d (``m.compile(backend="inductor")``). The schedule is 1F1B
(../lora_parallel/measure_lora_pp.py's ``one_f_one_b``: stage i of p runs min(p - i - 1, m) warm-up forwards);
the communication is replaced by what a receive leaves on the stage: a non-first stage's input is a fresh tensor
of the residual stream's shape with ``requires_grad=True``, a non-last stage's backward starts from a fresh
received gradient (``torch.autograd.backward(output, grad)``); the stage's inputs and outputs are kept until
their backward, as a schedule keeps them. Every forward step runs in a ``phase::forward`` range, every backward
step in ``phase::backward``, the step in ``phase::optimizer``: each phase's peak is the largest over its ranges
(the profiler's timeline above what is alive after ``zero_grad``, plus that baseline). Two warm-up iterations
(the blocks compile), the third measured. AdamW (foreach)."""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "lora_parallel"))

import harness  # noqa: E402  (validation/harness.py)
import torch  # noqa: E402

TT = dict(vocab_size=1024, num_layers=4, num_heads=8, num_kv_heads=8, embed_dim=256, max_seq_len=512,
          intermediate_dim=688, tie_word_embeddings=False)


def _cfg(regime, compile, stage, *, pp=2, m=2, b=1, seq=512):
    rid = f"tt-llama3_2-4l-v1024-untied-{regime}-{compile}-pp{pp}-stage{stage}-m{m}-b{b}-s{seq}"
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": TT["embed_dim"],
          "intermediate_size": TT["intermediate_dim"], "num_hidden_layers": TT["num_layers"],
          "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": TT["vocab_size"],
          "tie_word_embeddings": False, "head_dim": 32, "max_position_embeddings": seq, "rms_norm_eps": 1e-5,
          "hidden_act": "silu"}
    return {"id": rid, "torchtune": dict(TT, max_seq_len=seq), "hf_config": hf, "batch_size": b, "seq_len": seq,
            "regime": regime, "compile": compile, "optimizer": "adamw", "optimizer_impl": "foreach",
            "layout": {"pp_size": pp, "stage": stage, "microbatches": m, "schedule": "1f1b"}}


CONFIGS = ([_cfg("fp32", c, s) for s in (0, 1) for c in ("eager", "blocks")]
           + [_cfg("bf16", c, s, seq=256) for s in (0, 1) for c in ("eager", "blocks")])


class Stage(torch.nn.Module):
    """One stage of torchtune's ``TransformerDecoder``: its layers, the embedding on the first stage, the final
    norm, LM head and loss on the last (TransformerDecoder.forward's order)."""

    def __init__(self, model, lo, hi, first, last):
        super().__init__()
        self.first, self.last = first, last
        self.layers = torch.nn.ModuleList(list(model.layers)[lo:hi])
        self.tok_embeddings = model.tok_embeddings if first else None
        self.norm, self.output = (model.norm, model.output) if last else (None, None)
        self.loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100)

    def forward(self, x, ids):
        h = self.tok_embeddings(ids) if self.first else x
        for layer in self.layers:
            h = layer(h)
        if not self.last:
            return h
        logits = self.output(self.norm(h)).float()
        ignore = torch.full((ids.shape[0], 1), -100, dtype=ids.dtype)
        labels = torch.hstack((ids[..., 1:], ignore)).reshape(-1)
        loss = self.loss_fn(logits.reshape(-1, logits.size(-1)), labels)
        del logits
        return loss


def measure(cfg: dict) -> dict:
    from measure_lora_pp import one_f_one_b      # ../lora_parallel: the 1F1B order
    from torch.profiler import ProfilerActivity, profile, record_function
    from torchtune.models.llama3_2._component_builders import llama3_2

    lay = cfg["layout"]
    p, stage, m = lay["pp_size"], lay["stage"], lay["microbatches"]
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg["regime"]]
    model = llama3_2(**cfg["torchtune"]).to(dtype)
    per = cfg["torchtune"]["num_layers"] // p
    first, last = stage == 0, stage == p - 1
    net = Stage(model, stage * per, (stage + 1) * per, first, last)
    del model
    if cfg["compile"] == "blocks":
        for layer in net.layers:
            layer.compile(backend="inductor")     # torchtune's compile_model; torchtitan's apply_compile per block
    b, s, h = cfg["batch_size"], cfg["seq_len"], cfg["torchtune"]["embed_dim"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg["torchtune"]["vocab_size"], (b, s), generator=g)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
    order = one_f_one_b(p, stage, m)

    def iteration(mark):
        inputs, outputs = {}, {}
        for kind, i in order:
            with mark("forward" if kind == "F" else "backward"):
                if kind == "F":
                    x = None if first else torch.empty(b, s, h, dtype=dtype, requires_grad=True)   # the receive
                    outputs[i] = net(x, ids)
                    inputs[i] = x
                    del x
                else:
                    out = outputs.pop(i)
                    if last:
                        out.backward()
                    else:
                        torch.autograd.backward(out, torch.empty_like(out))     # the received gradient
                    del out
                    inputs.pop(i)        # its .grad sent to the previous stage
        with mark("optimizer"):
            optimizer.step()

    t0 = time.perf_counter()
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        iteration(lambda phase: contextlib.nullcontext())
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        iteration(lambda phase: record_function(harness.PHASE_PREFIX + phase))
    wall = time.perf_counter() - t0
    record = timeline(prof)
    del prof
    tensors = [*net.parameters(), *net.buffers(), ids,
               *(v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    torch._dynamo.reset()
    return {**record, "baseline_bytes": int(sum(storages.values())), "wall_s": round(wall, 1),
            "order": [f"{k}{i}" for k, i in order], "stage_layers": per}


def timeline(prof) -> dict:
    """harness.memory_timeline's running total, each phase's peak the largest over all its ranges."""
    events = prof.profiler.kineto_results.events()
    pre = harness.PHASE_PREFIX
    ranges = sorted(((e.name()[len(pre):], e.start_ns(), e.start_ns() + e.duration_ns())
                     for e in events if e.name().startswith(pre)), key=lambda r: r[1])
    mem = sorted(((e.start_ns(), e.nbytes()) for e in events
                  if e.name() == "[memory]" and e.device_type().name.lower() == "cpu"), key=lambda r: r[0])
    where, total, i = {}, 0, 0
    for name, start, end in ranges:
        while i < len(mem) and mem[i][0] < start:
            total += mem[i][1]
            i += 1
        ph = total
        while i < len(mem) and mem[i][0] <= end:
            total += mem[i][1]
            i += 1
            ph = max(ph, total)
        where[name] = max(where.get(name, 0), int(ph))
    return {"peak_bytes": max(where.values()), "peak_by_phase": where, "memory_events": len(mem)}


def document(args, runs, ctx) -> dict:
    import torchtune
    return {"generator": "/tmp/lossvenv/bin/python validation/compile/measure_blocks_pp.py",
            "python": platform.python_version(), "torch": torch.__version__, "torchtune": torchtune.__version__,
            "device": "cpu", "threads": torch.get_num_threads(), "timeline": "profiler memory timeline, per phase "
            "the largest over its ranges", "runs": runs}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "blocks_pp_measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda r: f"peak {r['peak_bytes']:>12,} B {r['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<56} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

#!/usr/bin/env python
"""Sanity check: do MemTracker's numbers mean what we think they mean?

    /tmp/valvenv/bin/python validation/check_tracker.py

Compares the tracker's byte counts with hand counts, exactly (to the byte):

1. A stack of bias-free ``nn.Linear`` layers trained with AdamW, stock ``MemTracker`` (no subclass):
   after the step, parameters + gradients + AdamW's two states = 16 bytes per parameter (fp32), plus
   4 bytes for the ``step`` tensor of every parameter tensor, plus the input. The peak of the step is
   that (fused), that plus one whole-model fp32 temporary (foreach: ``_foreach_sqrt`` of all ``exp_avg_sq``
   at once), or that plus max_i(2*n_i + n_(i-1)) elements (for-loop: ``exp_avg_sq.sqrt() /
   bias_correction2_sqrt`` makes two temporaries of parameter i while the previous parameter's ``denom``
   is still bound to the loop variable).
2. A tiny HF Llama through ``harness.py``'s own code path (``measure.py``'s runs): the same counts (in fp32 and in pure bf16, where
   everything is 2 bytes per parameter except the fp32 ``step`` tensors), and the fp32 logits mechanism:
   the first backward op of the cross-entropy (``_log_softmax_backward_data``) holds two fp32 tensors of
   b*s*V elements as ``temp``.
3. Real and fake tensors give the same bytes for the same configuration (tiny GPT-2, eager attention,
   dropout on).

Exits non-zero on the first mismatch. Takes about half a minute on two cores.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

import configs  # noqa: E402
import harness  # noqa: E402  (validation/harness.py)

FAILED = []


def check(name: str, got: int, want: int) -> None:
    ok = got == want
    print(f"{'ok  ' if ok else 'FAIL'} {name}: tracker {got:,} B, hand count {want:,} B"
          + ("" if ok else f" (diff {got - want:+,})"))
    if not ok:
        FAILED.append(name)


def linear_stack(impl: str) -> None:
    torch.manual_seed(0)
    widths = [256, 512, 384, 128]
    model = torch.nn.Sequential(*[torch.nn.Linear(a, b, bias=False) for a, b in zip(widths, widths[1:])])
    opt = harness.build_optimizer(model.parameters(), "adamw", impl)
    x = torch.randn(2, widths[0])
    sizes = [p.numel() for p in model.parameters()]
    n = sum(sizes)

    mt = MemTracker()
    mt.track_external(model, opt, x)

    def forward_backward():
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()

    with mt:
        for _ in range(2):
            forward_backward()
            opt.step()
            mt.reset_mod_stats()
        forward_backward()
    with mt:  # re-entering resets the peak: this context holds only the step
        opt.step()
        end = mt.get_tracker_snapshot("current")[torch.device("cpu")]["Total"]
    peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]

    states = 16 * n + 4 * len(sizes) + x.numel() * 4
    check(f"linear stack, AdamW {impl}: after step = 16 B/param + 4 B/step tensor + input", end, states)
    # fused: no temporaries. foreach: _foreach_sqrt(exp_avg_sq) of every parameter at once. for-loop:
    # denom = exp_avg_sq.sqrt() / bias_correction2_sqrt makes two temporaries of parameter i while
    # parameter i-1's denom is still bound to the loop variable.
    loop = max(2 * sizes[i] + (sizes[i - 1] if i else 0) for i in range(len(sizes)))
    temp = {"fused": 0, "foreach": 4 * n, "for-loop": 4 * loop}[impl]
    check(f"linear stack, AdamW {impl}: step peak = that + step temporaries", peak, states + temp)


def hf_llama() -> None:
    base = configs._cfg("check-llama", "gqa-tiny", 1, 128, optimizer_impl="foreach")
    for regime, bpe in (("fp32", 4), ("bf16", 2)):
        for impl in ("fused", "foreach"):
            cfg = dict(base, regime=regime, optimizer_impl=impl, id=f"check-{regime}-{impl}")
            m = harness.measure(cfg)
            n, n_tensors = m["parameters"], m["parameter_tensors"]
            buffers = m["alive"]["end_of_step"]["by_category"]["buffer"]
            inputs = 8 * cfg["batch_size"] * cfg["seq_len"]  # int64 input_ids ("other")
            states = 4 * bpe * n + 4 * n_tensors + buffers + inputs
            check(f"HF gqa-tiny {regime} AdamW {impl}: after step = {4 * bpe} B/param + step tensors",
                  m["alive"]["end_of_step"]["bytes"], states)
            opt_peak = m["peak_by_phase"]["optimizer"]["bytes"]
            temp = bpe * n if impl == "foreach" else 0
            check(f"HF gqa-tiny {regime} AdamW {impl}: optimizer-step peak", opt_peak, states + temp)
            bw = m["peak_by_phase"]["backward"]
            if bw["op"] == "aten._log_softmax_backward_data.default":
                bsv = cfg["batch_size"] * cfg["seq_len"] * cfg["hf_config"]["vocab_size"]
                check(f"HF gqa-tiny {regime}: temp at the first backward op = 2 fp32 b*s*V tensors",
                      bw["by_category"]["temp"], 2 * 4 * bsv)


def real_vs_fake() -> None:
    real = harness.measure(next(c for c in configs.CONFIGS if c["id"] == "twin-gpt2-tiny-fp32-eager-drop-b2-s256-real"))
    fake = harness.measure(next(c for c in configs.CONFIGS if c["id"] == "twin-gpt2-tiny-fp32-eager-drop-b2-s256-fake"))
    check("gpt2-tiny eager+dropout: real vs fake peak", fake["peak_bytes"], real["peak_bytes"])
    for cat, v in real["by_category_at_peak"].items():
        check(f"gpt2-tiny: real vs fake {cat} at peak", fake["by_category_at_peak"][cat], v)


def main() -> int:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print(f"torch {torch.__version__}")
    for impl in ("fused", "foreach", "for-loop"):
        linear_stack(impl)
    hf_llama()
    real_vs_fake()
    print(f"{'all checks passed' if not FAILED else f'{len(FAILED)} checks FAILED'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

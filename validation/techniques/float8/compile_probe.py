"""torch.compile under MemTracker (issue 16, item 7): can the tracker measure an inductor-compiled model?

    /tmp/fp8venv/bin/python validation/techniques/float8/compile_probe.py

A tiny bf16 Llama is compiled with torch.compile(backend="inductor") and warmed up outside the tracker
(compiled there: 1 graph, 61 extern calls), then measured with measure.py's protocol. Result (torch 2.13.0
CPU): every phase's bytes equal the eager run's to the byte (forward 25,226,092, backward 25,746,268,
optimizer 24,918,868 B) with eager's unfused ops at the peaks (nll_loss_forward, _log_softmax_backward_data)
and no recompilation: under MemTracker, a TorchDispatchMode, the compiled frames run eagerly, so what
inductor saves cannot be measured here and the profile refuses ``compile``.
"""
import sys, json, time
import os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import harness as M  # validation/harness.py
import torch, torch._dynamo
from torch._dynamo.utils import counters
from transformers import AutoConfig, AutoModelForCausalLM
torch.manual_seed(0)
cfg = AutoConfig.for_model("llama", hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=1024, use_cache=False, tie_word_embeddings=False)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16); model.train()
run = torch.compile(model, backend="inductor")
opt = M.build_optimizer(list(model.parameters()), "adamw", "foreach")
ids = torch.randint(0, 1024, (2, 128))
# warm-up outside the tracker: compile here
for _ in range(2):
    opt.zero_grad(set_to_none=True); run(input_ids=ids, labels=ids, use_cache=False).loss.backward(); opt.step()
print("after warm-up:", dict(counters["stats"]), dict(counters["inductor"]) if "inductor" in counters else None, flush=True)
before = dict(counters["stats"])
mt = M.PhaseMemTracker(); mt.track_external(model, opt, ids)
ops = []
orig = mt.__class__.__torch_dispatch__
alive, _ = M.run_protocol(mt, run, opt, ids)
rec = M.peak_record(mt)
print("under tracker:", dict(counters["stats"]), "recompiled:", dict(counters["stats"]) != before)
print(json.dumps({ph: (v["bytes"], v["op"], v["module"]) for ph, v in rec["peak_by_phase"].items()}))
print({k: v["bytes"] for k, v in alive.items()})

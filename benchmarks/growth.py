"""How the cost of a solve and of a search grows: with layers, plugins and candidates.

    python benchmarks/growth.py

Prints median microseconds per solve for models of 8 to 512 layers, for 0 to 16 extra
component-hook plugins taking part (each adds one term to a component), and the wall
time of plan searches of growing size.
"""

from __future__ import annotations

import statistics
import time
import timeit

from mlsysim_core import (ACTIVATIONS, HardwareNode, MemoryTerm, TrainingMemoryModel, TransformerWorkload,
                          hookimpl, search)
from mlsysim_core.manager import PluginManager

GPU = HardwareNode(name="gpu", memory_capacity=80 * 2**30, devices_per_node=8)


def per_call(fn, number=2000) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=number, repeat=9)) / number * 1e6


def extra_plugin(i: int):
    class Extra:
        @hookimpl
        def mlsysim_activation_terms(self, plan):
            return [MemoryTerm(component=ACTIVATIONS, label=f"extra {i}", nbytes=1000 * (i + 1))]
    return Extra()


def main() -> None:
    solver = TrainingMemoryModel()
    print("layers   us/solve")
    for layers in (8, 32, 128, 512):
        model = TransformerWorkload(name="m", parameters=10**10, layers=layers, hidden_dim=4096, heads=32)
        print(f"{layers:>6}   {per_call(lambda: solver.solve(model, GPU, 8, pp_size=4, dp_size=8, zero_stage=1)):8.1f}")

    base = PluginManager.from_environment(autoload=False)
    model = TransformerWorkload(name="m", parameters=10**10, layers=32, hidden_dim=4096, heads=32)
    print("\nextra component plugins   us/solve")
    for n in (0, 1, 4, 16):
        pm = PluginManager()
        for name in sorted(base.registry.plugins):
            pm.register(base.get_plugin(name), name=name, info=base.info(name))
        names = [f"extra{i:02d}" for i in range(n)]
        for i, name in enumerate(names):
            pm.register(extra_plugin(i), name=name)
        s = TrainingMemoryModel(plugin_manager=pm)
        print(f"{n:>24}   {per_call(lambda: s.solve(model, GPU, 8, include_plugins=names)):8.1f}")

    print("\nsearch: devices  candidates   solves   seconds   candidates/s")
    for devices, batch in ((16, 64), (32, 256), (64, 512), (128, 1024)):   # every layout, cp included
        t = time.perf_counter()
        found = search.search_plans("mixtral-8x7b", "h100", devices=devices, global_batch=batch, seq_len=4096,
                                    solver=solver)
        dt = time.perf_counter() - t
        print(f"{devices:>15}  {found.candidates:>10,}  {found.solves:>7,}  {dt:>8.2f}   {found.candidates / dt:>12,.0f}")


if __name__ == "__main__":
    main()

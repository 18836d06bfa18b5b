"""Meta-tests: the documentation in docs/ keeps up with the code.

Every hook spec is documented under its exact signature, every public name and every
field of the public types is mentioned, every CLI subcommand is in the quickstart, the
golden number is the solver's, and links between the pages resolve.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import attrs
import pytest

import mlsysim_core
from mlsysim_core import hookspecs

DOCS = Path(__file__).resolve().parents[2] / "docs"


def read(page: str) -> str:
    return (DOCS / page).read_text(encoding="utf-8")


def hook_specs() -> list[tuple[str, list[str]]]:
    return [(name, list(inspect.signature(function).parameters))
            for name, function in sorted(vars(hookspecs).items())
            if name.startswith("mlsysim_") and inspect.isfunction(function)]


def headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"#{1,6} ", line)]


def mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) is not None


def test_every_hook_spec_is_found():
    names = [name for name, _ in hook_specs()]
    from mlsysim_core.manager import _REGISTRATION     # the registration hooks, by name
    assert set(_REGISTRATION) <= set(names)
    assert set(hookspecs.COMPONENT_HOOKS.values()) <= set(names)


@pytest.mark.parametrize("name,argnames", hook_specs(), ids=[n for n, _ in hook_specs()])
def test_hook_is_documented_under_its_exact_signature(name, argnames):
    signature = f"{name}({', '.join(argnames)})"
    titles = [line for line in headings(read("hooks.md")) if signature in line]
    assert titles, f"docs/hooks.md needs a section titled with `{signature}`"


@pytest.mark.parametrize("name", mlsysim_core.__all__)
def test_public_name_is_documented(name):
    assert mentions(read("api.md"), name) or mentions(read("hooks.md"), name), (
        f"mlsysim_core.{name} is in __all__ but neither docs/api.md nor docs/hooks.md mentions it")


def test_solve_parameters_are_documented():
    api = read("api.md")
    parameters = list(inspect.signature(mlsysim_core.TrainingMemoryModel.solve).parameters)[1:]
    missing = [p for p in parameters if f"`{p}`" not in api]
    assert not missing, f"docs/api.md does not document solve() parameters: {missing}"


FIELD_PAGES = {
    "api.md": ("TrainingMemoryResult", "TransformerWorkload", "SparseTransformerWorkload",
               "HardwareNode"),
    "hooks.md": ("OptimizerSpec", "CheckpointingSpec", "ShardingRuleSpec", "ShardingEffect",
                 "ProfileSpec", "TrainingPlan", "Placement"),
}


@pytest.mark.parametrize("page,type_name",
                         [(page, t) for page, types in FIELD_PAGES.items() for t in types])
def test_fields_of_public_types_are_documented(page, type_name):
    text = read(page)
    fields = [f.name for f in attrs.fields(getattr(mlsysim_core, type_name))]
    missing = [f for f in fields if f"`{f}`" not in text]
    assert not missing, f"docs/{page} does not document these fields of {type_name}: {missing}"


def test_inverse_and_search_apis_are_documented():
    """Every parameter of the inverse solves and the plan search, and every field of what
    they return, is named in docs/api.md."""
    from mlsysim_core import inverse, search
    api = read("api.md")
    names = [p for f in (inverse.largest_batch, inverse.longest_sequence, inverse.fewest_devices,
                         search.search_plans)
             for p in inspect.signature(f).parameters if p not in ("model", "hardware", "solve_kwargs")]
    names += [f.name for cls in (inverse.InverseAnswer, search.PlanSearch) for f in attrs.fields(cls)]
    names += list(search.Candidate._fields)
    missing = sorted({n for n in names if f"`{n}`" not in api})
    assert not missing, f"docs/api.md does not document: {missing}"


def test_memory_term_fields_are_documented():
    text = read("concepts.md")
    missing = [f.name for f in attrs.fields(mlsysim_core.MemoryTerm) if f"`{f.name}`" not in text]
    assert not missing, f"docs/concepts.md does not document these MemoryTerm fields: {missing}"


def test_every_cli_subcommand_is_in_the_quickstart():
    from mlsysim_core.cli import COMMANDS
    quickstart = read("quickstart.md")
    assert set(COMMANDS) >= {"estimate", "plugins", "models", "hardware"}
    missing = [c for c in COMMANDS if f"mlsysim-core {c}" not in quickstart]
    assert not missing, f"docs/quickstart.md does not show: {missing}"


def test_golden_number_is_the_solvers_and_is_explained():
    result = mlsysim_core.TrainingMemoryModel().solve("mlsysim:llama3-8b", "mlsysim:h100", batch_size=8, seq_len=1024)
    assert f"{result.gb.total_memory:.2f}" == "165.79"
    assert "165.79" in read("quickstart.md")
    assert "165.79" in read("concepts.md")
    assert repr(result.gb.total_memory) in read("concepts.md")        # 165.790222016


def _slug(heading: str) -> str:
    text = heading.lstrip("#").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_links_between_pages_resolve():
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert {"index.md", "quickstart.md", "concepts.md", "hooks.md", "writing-plugins.md",
            "api.md"} <= set(pages)
    anchors = {page: {_slug(h) for h in headings(read(page))} for page in pages}
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", read(page)):
            if re.match(r"[a-z]+:", target) or target.startswith("../"):
                continue    # external, or outside docs/
            file, _, anchor = target.partition("#")
            file = file or page
            if file not in anchors:
                broken.append(f"{page}: {target} (no such page)")
            elif anchor and anchor not in anchors[file]:
                broken.append(f"{page}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)

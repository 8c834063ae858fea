"""No code outside `tirl.rollout` names a concrete engine class: it asks the capabilities and the factory."""

import ast
import re
from pathlib import Path

import tirl
from tirl.rollout.factory import ENGINES, engine_class

SRC = Path(tirl.__file__).parent
ROLLOUT = SRC / "rollout"


def engine_classes() -> set[str]:
    """The classes the factory builds and their bases in tirl.rollout, and any rollout class that declares
    `capabilities` (an engine the factory does not list yet)."""
    found = {
        c.__name__
        for name in ENGINES
        for c in engine_class(name).__mro__
        if c.__module__.startswith("tirl.rollout.")
    }
    for path in ROLLOUT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(s, ast.Assign | ast.AnnAssign) and "capabilities = " in ast.unparse(s)
                for s in node.body
            ):
                found.add(node.name)
    return found


def naming(source: str, names: set[str]) -> set[str]:
    return set(re.findall(r"\b(" + "|".join(sorted(names)) + r")\b", source))


def test_the_engine_classes_are_found():
    classes = engine_classes()
    assert {"TorchEngine", "VLLMEngine", "OpenAIEngine"} <= classes and "Engine" not in classes


def test_checker_sees_a_name_in_code_and_text():
    source = "from tirl.rollout.engines.torch.engine import TorchEngine\nx = isinstance(e, VLLMEngine)"
    assert naming(source, {"TorchEngine", "VLLMEngine"}) == {"TorchEngine", "VLLMEngine"}
    assert naming("TorchEngines = 1; MyTorchEngine(); Engine", {"TorchEngine"}) == set()


def test_no_module_outside_rollout_names_an_engine_class():
    classes = engine_classes()
    offenders = {
        str(path.relative_to(SRC)): sorted(found)
        for path in sorted(SRC.rglob("*.py"))
        if ROLLOUT not in path.parents and (found := naming(path.read_text(), classes))
    }
    assert offenders == {}, f"ask tirl.rollout.capabilities / tirl.rollout.factory instead: {offenders}"


def test_no_caller_asks_an_engine_for_a_member_the_protocol_does_not_declare():
    """`getattr`/`hasattr` on an engine hides a member the protocol should declare (tirl.rollout.engines.base)."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and re.search(r"\bengine\b|\beng\b", ast.unparse(node.args[0]))
            ):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == [], offenders
